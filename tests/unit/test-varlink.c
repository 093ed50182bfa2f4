/* SPDX-License-Identifier: MIT */
/* test-varlink.c — framing, calls and replies, the output queue, the stream over real sockets, and the
 * interface definition (checked against the varlink.org grammar by a small parser below). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "varlink-tree.h"
#include "varlink.h"
#include "test-fds.h"

/* ---- helpers ---- */

static json_t *parse(const char *text) {
        json_t *v = NULL;
        assert_int_equal(json_parse_object(text, strlen(text), &v), 0);
        return v;
}

static void socketpair_nonblock(int sv[2]) {
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
}

/* Takes every whole message from in; asserts each equals expected, in order. Returns how many. */
static size_t take_all(VarlinkInput *in, const char *expected) {
        _cleanup_(json_decrefp) json_t *want = parse(expected);
        size_t n = 0;
        for (;;) {
                _cleanup_(json_decrefp) json_t *m = NULL;
                int r = varlink_input_next(in, &m);
                assert_true(r >= 0);
                if (r == 0)
                        return n;
                assert_true(json_equal(m, want));
                n++;
        }
}

/* ---- names ---- */

static void test_interface_name_follows_grammar(void **state) {
        static const char *const good[] = {
                "io.slotbroker", "org.varlink.service", "a.b", "a.0", "a-b.c", "a--b.c-d", "x.y.z", "io.x2",
        };
        static const char *const bad[] = {
                "", "io", "Io.slotbroker", "io.Slotbroker", ".io", "io.", "io..x", "-io.x", "io-.x", "io.-x",
                "io.x-", "0io.x", "io_x.y", "io.x y", "io.x/y", "é.x",
        };
        for (size_t i = 0; i < ELEMENTSOF(good); i++)
                assert_true(varlink_interface_name_valid(good[i]));
        for (size_t i = 0; i < ELEMENTSOF(bad); i++)
                assert_false(varlink_interface_name_valid(bad[i]));
        assert_false(varlink_interface_name_valid(NULL));
}

static void test_member_name_follows_grammar(void **state) {
        assert_true(varlink_member_name_valid("Acquire"));
        assert_true(varlink_member_name_valid("A"));
        assert_true(varlink_member_name_valid("GetInfo2"));
        assert_false(varlink_member_name_valid(""));
        assert_false(varlink_member_name_valid("acquire"));
        assert_false(varlink_member_name_valid("Get_Info"));
        assert_false(varlink_member_name_valid("Get-Info"));
        assert_false(varlink_member_name_valid("2Get"));
        assert_false(varlink_member_name_valid(NULL));
}

static void test_method_split_finds_interface_and_member(void **state) {
        size_t n = 0;
        const char *member = NULL;

        assert_int_equal(varlink_method_split("io.slotbroker.Acquire", &n, &member), 0);
        assert_int_equal(n, strlen("io.slotbroker"));
        assert_string_equal(member, "Acquire");
        assert_int_equal(varlink_method_split("org.varlink.service.GetInfo", NULL, NULL), 0);
}

static void test_method_split_refuses_bad_names(void **state) {
        static const char *const bad[] = {
                "", "Acquire", "io.Acquire", "io.slotbroker.", "io.slotbroker.acquire", "io.slotbroker",
                ".Acquire", "IO.slotbroker.Acquire", "io.slotbroker.Acq uire", "io..slotbroker.Acquire",
                "io.slotbroker.Acquire.", "io.slotbroker.Acquire()",
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                size_t n = 77;
                const char *member = "untouched";
                assert_int_equal(varlink_method_split(bad[i], &n, &member), -EINVAL);
                assert_int_equal(n, 77);
                assert_string_equal(member, "untouched");
                assert_false(varlink_qualified_name_valid(bad[i]));
        }
}

static void test_method_in_interface_matches_whole_interface(void **state) {
        assert_true(varlink_method_in_interface("io.slotbroker.Acquire", "io.slotbroker"));
        assert_true(varlink_method_in_interface("org.varlink.service.GetInfo", VARLINK_SERVICE_INTERFACE));
        assert_false(varlink_method_in_interface("io.slotbrokerx.Acquire", "io.slotbroker"));
        assert_false(varlink_method_in_interface("io.slotbroker.x.Acquire", "io.slotbroker"));
        assert_false(varlink_method_in_interface("io.slot.Acquire", "io.slotbroker"));
}

/* ---- calls ---- */

static void test_call_parse_reads_method_parameters_and_flags(void **state) {
        _cleanup_(json_decrefp) json_t *m = parse(
                "{\"method\":\"io.slotbroker.Acquire\",\"parameters\":{\"lane\":\"merge\"},\"more\":true}");
        VarlinkCall c = {};

        assert_int_equal(tree_call_parse(m, &c), 0);
        assert_string_equal(c.method, "io.slotbroker.Acquire");
        assert_string_equal(json_string_value(json_object_get(c.parameters, "lane")), "merge");
        assert_int_equal(c.flags, VARLINK_CALL_MORE);
}

static void test_call_parse_reads_oneway_and_upgrade(void **state) {
        _cleanup_(json_decrefp) json_t *a = parse("{\"method\":\"a.b.C\",\"oneway\":true,\"more\":false}");
        _cleanup_(json_decrefp) json_t *b = parse("{\"method\":\"a.b.C\",\"upgrade\":true}");
        VarlinkCall c = {};

        assert_int_equal(tree_call_parse(a, &c), 0);
        assert_int_equal(c.flags, VARLINK_CALL_ONEWAY);
        assert_int_equal(tree_call_parse(b, &c), 0);
        assert_int_equal(c.flags, VARLINK_CALL_UPGRADE);
}

static void test_call_parse_adds_empty_parameters(void **state) {
        _cleanup_(json_decrefp) json_t *m = parse("{\"method\":\"io.slotbroker.Status\"}");
        _cleanup_(json_decrefp) json_t *n = parse("{\"method\":\"io.slotbroker.Status\",\"parameters\":null}");
        VarlinkCall c = {};

        assert_int_equal(tree_call_parse(m, &c), 0);
        assert_true(json_is_object(c.parameters));
        assert_int_equal(json_object_size(c.parameters), 0);
        assert_int_equal(c.flags, 0);
        assert_int_equal(tree_call_parse(n, &c), 0);
        assert_true(json_is_object(c.parameters));
}

static void test_call_parse_treats_null_flags_as_false(void **state) {
        _cleanup_(json_decrefp) json_t *m = parse(
                "{\"method\":\"io.slotbroker.Status\",\"more\":null,\"oneway\":null,\"upgrade\":null}");
        VarlinkCall c = {};

        assert_int_equal(tree_call_parse(m, &c), 0);
        assert_int_equal(c.flags, 0);
}

static void assert_call_refused(const char *text) {
        _cleanup_(json_decrefp) json_t *m = parse(text);
        VarlinkCall c = { .method = "untouched" };

        assert_int_equal(tree_call_parse(m, &c), -EBADMSG);
        assert_string_equal(c.method, "untouched");
        assert_null(c.parameters);
}

static void test_call_parse_refuses_missing_method(void **state) {
        assert_call_refused("{}");
        assert_call_refused("{\"parameters\":{}}");
        assert_call_refused("{\"method\":null}");
}

static void test_call_parse_refuses_bad_method_names(void **state) {
        static const char *const bad[] = {
                "{\"method\":\"\"}",
                "{\"method\":\"Acquire\"}",
                "{\"method\":\"io.slotbroker\"}",
                "{\"method\":\"io.slotbroker.acquire\"}",
                "{\"method\":\"io.slotbroker.Acquire \"}",
                "{\"method\":\"io.slotbroker.Acq\\u0000uire\"}",
                "{\"method\":\"io.slotbroker.Acquire\\u0000\"}",
                "{\"method\":\"IO.slotbroker.Acquire\"}",
                "{\"method\":\"io..Acquire\"}",
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++)
                assert_call_refused(bad[i]);
}

static void test_call_parse_refuses_more_with_oneway(void **state) {
        assert_call_refused("{\"method\":\"io.slotbroker.Acquire\",\"more\":true,\"oneway\":true}");
}

static void test_call_parse_refuses_wrong_types_of_every_field(void **state) {
        static const char *const bad[] = {
                "{\"method\":1}",
                "{\"method\":[\"a.b.C\"]}",
                "{\"method\":{}}",
                "{\"method\":true}",
                "{\"method\":\"a.b.C\",\"parameters\":[]}",
                "{\"method\":\"a.b.C\",\"parameters\":\"{}\"}",
                "{\"method\":\"a.b.C\",\"parameters\":1}",
                "{\"method\":\"a.b.C\",\"more\":1}",
                "{\"method\":\"a.b.C\",\"more\":\"true\"}",
                "{\"method\":\"a.b.C\",\"oneway\":0}",
                "{\"method\":\"a.b.C\",\"oneway\":[]}",
                "{\"method\":\"a.b.C\",\"upgrade\":{}}",
                "{\"method\":\"a.b.C\",\"upgrade\":\"yes\"}",
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++)
                assert_call_refused(bad[i]);
}

static void test_call_parse_refuses_unknown_key(void **state) {
        assert_call_refused("{\"method\":\"a.b.C\",\"params\":{}}");
        assert_call_refused("{\"method\":\"a.b.C\",\"continues\":true}");
}

/* A call read straight from its bytes is the call read from the tree, and what the tree's parse refuses
 * (malformed JSON, a duplicate key) or the call's (not a call) is refused with the same distinction. */
static void test_call_message_parse_is_the_tree_parse(void **state) {
        static const char *const messages[] = {
                "{\"method\":\"io.slotbroker.Acquire\",\"parameters\":{\"lane\":\"a\"},\"more\":true}",
                " {\"more\":null, \"oneway\":true,\"method\":\"a.b.C\"} \n",
                "{\"method\":\"a.b.C\",\"parameters\":null,\"upgrade\":true,\"org.example.x\":[1,{}]}",
                "{\"meth\\u006fd\":\"a.b.C\",\"parameters\":{\"x\":{\"y\":[null]}}}",
                "{\"method\":\"a\\u002eb.C\"}",
                /* not a call */
                "{}", "{\"parameters\":{}}", "{\"method\":5}", "{\"method\":\"a.b\"}", "{\"method\":\"a.b.C\\u0000\"}",
                "{\"method\":\"a.b.C\",\"parameters\":[]}", "{\"method\":\"a.b.C\",\"more\":1}",
                "{\"method\":\"a.b.C\",\"more\":true,\"oneway\":true}", "{\"method\":\"a.b.C\",\"lane\":\"x\"}",
                "{\"method\":{},\"method2\":1}",
                /* malformed, wherever it is */
                "", "[]", "{\"method\":\"a.b.C\"", "{\"method\":\"a.b.C\"}x", "{\"method\":\"a.b.C\",\"method\":\"a.b.C\"}",
                "{\"method\":\"a.b.C\",\"meth\\u006fd\":\"a.b.C\"}", "{\"method\":5,\"x\":}",
                "{\"a.b\":1,\"a.b\":2,\"method\":\"a.b.C\"}", "{\"x\":1,\"x\":2}", "{\"method\":\"a.b.C\",\"parameters\":{\"a\":1,\"a\":1}}",
                "{\"more\\u0000\":true,\"method\":\"a.b.C\"}", "{\"method\":\"\\ud800\"}",
        };
        for (size_t i = 0; i < ELEMENTSOF(messages); i++) {
                const char *t = messages[i];
                _cleanup_(varlink_call_message_done) VarlinkCallMessage m = VARLINK_CALL_MESSAGE_INIT;
                int r = varlink_call_message_parse(t, strlen(t), &m);
                _cleanup_(json_decrefp) json_t *tree = NULL;
                VarlinkCall call;
                int want = json_parse_object(t, strlen(t), &tree);
                if (want == 0)
                        want = tree_call_parse(tree, &call) < 0 ? -EPROTO : 0;
                if (r != want)
                        fail_msg("%s: %d, not %d", t, r, want);
                if (r < 0) {
                        assert_null(m.method);
                        continue;
                }
                VarlinkCall direct = varlink_call_message_call(&m);
                assert_string_equal(direct.method, call.method);
                assert_int_equal(direct.flags, call.flags);
                assert_true(json_equal(direct.parameters, call.parameters));
                assert_null(direct.fds);
        }
        /* Each class above is there. */
        const char *ok = messages[0], *not_call = messages[5], *bad = messages[15];
        VarlinkCallMessage m = VARLINK_CALL_MESSAGE_INIT;
        assert_int_equal(varlink_call_message_parse(ok, strlen(ok), &m), 0);
        varlink_call_message_done(&m);
        assert_null(m.method);
        assert_int_equal(varlink_call_message_parse(not_call, strlen(not_call), &m), -EPROTO);
        assert_int_equal(varlink_call_message_parse(bad, strlen(bad), &m), -EBADMSG);
}

/* The same for replies, against tree_reply_parse() on the tree. */
static void test_reply_message_parse_is_the_tree_parse(void **state) {
        static const char *const messages[] = {
                "{\"parameters\":{\"state\":\"granted\",\"lease\":{\"id\":\"L\"}},\"continues\":true}",
                "{\"parameters\":null}", "{}", "{\"error\":null,\"continues\":null}",
                "{\"error\":\"io.slotbroker.Busy\",\"parameters\":{\"retryAfterSec\":1}}",
                "{\"err\\u006fr\":\"a.b.C\",\"org.example.x\":1}",
                /* not a reply */
                "{\"error\":5}", "{\"error\":\"busy\"}", "{\"error\":\"a.b.C\",\"continues\":true}",
                "{\"parameters\":[]}", "{\"continues\":\"yes\"}", "{\"state\":\"granted\"}", "{\"method\":\"a.b.C\"}",
                "{\"error\":\"a.b.C\\u0000\"}",
                /* malformed */
                "{\"parameters\":{}", "{\"error\":null,\"error\":null}", "{\"continues\":true,\"continues\":true}",
                "{\"a.b\":1,\"a.b\":1}", "[{}]", "{\"parameters\":{\"x\":1,\"x\":2}}",
        };
        for (size_t i = 0; i < ELEMENTSOF(messages); i++) {
                const char *t = messages[i];
                _cleanup_(varlink_reply_message_done) VarlinkReplyMessage m = VARLINK_REPLY_MESSAGE_INIT;
                int r = varlink_reply_message_parse(t, strlen(t), &m);
                _cleanup_(json_decrefp) json_t *tree = NULL;
                VarlinkReply reply;
                int want = json_parse_object(t, strlen(t), &tree);
                if (want == 0)
                        want = tree_reply_parse(tree, &reply) < 0 ? -EPROTO : 0;
                if (r != want)
                        fail_msg("%s: %d, not %d", t, r, want);
                if (r < 0) {
                        assert_null(m.parameters);
                        continue;
                }
                VarlinkReply direct = varlink_reply_message_reply(&m);
                assert_true(streq_ptr(direct.error, reply.error));
                assert_int_equal(direct.flags, reply.flags);
                assert_true(json_equal(direct.parameters, reply.parameters));
        }
        const char *ok = messages[0], *not_reply = messages[6], *bad = messages[14];
        VarlinkReplyMessage m = VARLINK_REPLY_MESSAGE_INIT;
        assert_int_equal(varlink_reply_message_parse(ok, strlen(ok), &m), 0);
        varlink_reply_message_done(&m);
        assert_int_equal(varlink_reply_message_parse(not_reply, strlen(not_reply), &m), -EPROTO);
        assert_int_equal(varlink_reply_message_parse(bad, strlen(bad), &m), -EBADMSG);
        assert_null(m.parameters);
}

/* The input hands out calls read straight: the message is taken whatever it was, its fds with it only
 * when it was a call. */
static void test_input_next_call_takes_every_message(void **state) {
        VarlinkInput in;
        VarlinkCallMessage m = VARLINK_CALL_MESSAGE_INIT;
        static const char stream[] = "{\"method\":\"a.b.C\"}\0{\"x\":1}\0{\0{\"method\":\"a.b.D\",\"more\":true}\0{\"meth";

        varlink_input_init(&in, 0);
        assert_int_equal(varlink_input_feed(&in, stream, sizeof stream - 1), 0);
        assert_int_equal(varlink_input_next_call_with_fds(&in, &m, NULL), 1);
        assert_string_equal(m.method, "a.b.C");
        assert_int_equal(json_object_size(m.parameters), 0);
        varlink_call_message_done(&m);
        assert_int_equal(varlink_input_next_call_with_fds(&in, &m, NULL), -EPROTO);
        assert_int_equal(varlink_input_next_call_with_fds(&in, &m, NULL), -EBADMSG);
        assert_int_equal(varlink_input_next_call_with_fds(&in, &m, NULL), 1);
        assert_string_equal(m.method, "a.b.D");
        assert_int_equal(m.flags, VARLINK_CALL_MORE);
        varlink_call_message_done(&m);
        assert_int_equal(varlink_input_next_call_with_fds(&in, &m, NULL), 0); /* the last one is not whole */
        assert_null(m.method);
        varlink_input_done(&in);
}

static void test_call_parse_ignores_vendor_extension(void **state) {
        _cleanup_(json_decrefp) json_t *m = parse("{\"method\":\"a.b.C\",\"org.example.trace\":{\"id\":1}}");
        VarlinkCall c = {};

        assert_int_equal(tree_call_parse(m, &c), 0);
}

static void test_call_parse_refuses_non_object(void **state) {
        _cleanup_(json_decrefp) json_t *a = json_array();
        VarlinkCall c = {};

        assert_int_equal(tree_call_parse(a, &c), -EBADMSG);
        assert_int_equal(tree_call_parse(NULL, &c), -EBADMSG);
}

/* ---- replies ---- */

static void test_reply_parse_reads_parameters_and_continues(void **state) {
        _cleanup_(json_decrefp) json_t *m = parse("{\"parameters\":{\"state\":\"queued\"},\"continues\":true}");
        VarlinkReply r = {};

        assert_int_equal(tree_reply_parse(m, &r), 0);
        assert_null(r.error);
        assert_int_equal(r.flags, VARLINK_REPLY_CONTINUES);
        assert_string_equal(json_string_value(json_object_get(r.parameters, "state")), "queued");
}

static void test_reply_parse_reads_error(void **state) {
        _cleanup_(json_decrefp) json_t *m = parse(
                "{\"error\":\"io.slotbroker.QueueShed\",\"parameters\":{\"retryAfterSec\":7}}");
        _cleanup_(json_decrefp) json_t *bare = parse("{\"error\":\"org.varlink.service.PermissionDenied\"}");
        VarlinkReply r = {};

        assert_int_equal(tree_reply_parse(m, &r), 0);
        assert_string_equal(r.error, "io.slotbroker.QueueShed");
        assert_int_equal(r.flags, 0);
        assert_int_equal(json_integer_value(json_object_get(r.parameters, "retryAfterSec")), 7);
        assert_int_equal(tree_reply_parse(bare, &r), 0);
        assert_string_equal(r.error, VARLINK_ERROR_PERMISSION_DENIED);
        assert_true(json_is_object(r.parameters));
}

static void test_reply_parse_takes_empty_object_as_empty_reply(void **state) {
        _cleanup_(json_decrefp) json_t *m = parse("{\"continues\":false,\"error\":null}");
        VarlinkReply r = { .error = "x" };

        assert_int_equal(tree_reply_parse(m, &r), 0);
        assert_null(r.error);
        assert_int_equal(r.flags, 0);
        assert_int_equal(json_object_size(r.parameters), 0);
}

static void assert_reply_refused(const char *text) {
        _cleanup_(json_decrefp) json_t *m = parse(text);
        VarlinkReply r = { .error = "untouched" };

        assert_int_equal(tree_reply_parse(m, &r), -EBADMSG);
        assert_string_equal(r.error, "untouched");
}

static void test_reply_parse_refuses_continues_on_error(void **state) {
        assert_reply_refused("{\"error\":\"a.b.C\",\"continues\":true}");
}

static void test_reply_parse_refuses_wrong_types_of_every_field(void **state) {
        static const char *const bad[] = {
                "{\"parameters\":[]}",
                "{\"parameters\":\"x\"}",
                "{\"continues\":1}",
                "{\"continues\":\"true\"}",
                "{\"error\":1}",
                "{\"error\":\"Shed\"}",
                "{\"error\":\"a.b.C\\u0000\"}",
                "{\"error\":{}}",
                "{\"method\":\"a.b.C\"}",
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++)
                assert_reply_refused(bad[i]);
}

/* ---- builders ---- */

static void assert_bytes(const char *got, size_t got_size, const char *want_json) {
        /* want_json + its NUL, exactly. */
        assert_int_equal(got_size, strlen(want_json) + 1);
        assert_memory_equal(got, want_json, got_size);
}

static void test_call_format_is_compact_json_with_nul(void **state) {
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s, s:i}", "lane", "merge", "slots", 2);
        _cleanup_free_ char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;

        assert_int_equal(varlink_call_format("io.slotbroker.Acquire", p, VARLINK_CALL_MORE, &a, &na), 0);
        assert_bytes(a, na, "{\"method\":\"io.slotbroker.Acquire\",\"parameters\":{\"lane\":\"merge\",\"slots\":2},\"more\":true}");
        assert_int_equal(varlink_call_format("io.slotbroker.Status", NULL, 0, &b, &nb), 0);
        assert_bytes(b, nb, "{\"method\":\"io.slotbroker.Status\",\"parameters\":{}}");
}

static void test_call_format_writes_oneway_and_upgrade(void **state) {
        _cleanup_free_ char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;

        assert_int_equal(varlink_call_format("a.b.C", NULL, VARLINK_CALL_ONEWAY, &a, &na), 0);
        assert_bytes(a, na, "{\"method\":\"a.b.C\",\"parameters\":{},\"oneway\":true}");
        assert_int_equal(varlink_call_format("a.b.C", NULL, VARLINK_CALL_UPGRADE, &b, &nb), 0);
        assert_bytes(b, nb, "{\"method\":\"a.b.C\",\"parameters\":{},\"upgrade\":true}");
}

static void test_call_new_refuses_more_with_oneway_and_bad_names(void **state) {
        json_t *m = NULL;
        _cleanup_(json_decrefp) json_t *array = json_array();

        assert_int_equal(varlink_call_new("a.b.C", NULL, VARLINK_CALL_MORE | VARLINK_CALL_ONEWAY, &m), -EINVAL);
        assert_int_equal(varlink_call_new("a.b.c", NULL, 0, &m), -EINVAL);
        assert_int_equal(varlink_call_new(NULL, NULL, 0, &m), -EINVAL);
        assert_int_equal(varlink_call_new("a.b.C", array, 0, &m), -EINVAL);
        assert_int_equal(varlink_call_new("a.b.C", NULL, 1 << 7, &m), -EINVAL);
        assert_null(m);
}

static void test_reply_format_writes_continues_only_when_asked(void **state) {
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "state", "queued");
        _cleanup_free_ char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;

        assert_int_equal(varlink_reply_format(p, VARLINK_REPLY_CONTINUES, &a, &na), 0);
        assert_bytes(a, na, "{\"parameters\":{\"state\":\"queued\"},\"continues\":true}");
        assert_int_equal(varlink_reply_format(NULL, 0, &b, &nb), 0);
        assert_bytes(b, nb, "{\"parameters\":{}}");
}

/* varlink_stream_call() and varlink_stream_reply() write their envelope themselves: the same bytes as the
 * formatters that build it as a json_t. */
static void assert_stream_bytes(VarlinkStream *s, int peer, const char *expected, size_t size) {
        char buf[512];

        assert_int_equal(varlink_stream_flush(s), 0);
        assert_int_equal(read(peer, buf, sizeof buf), (ssize_t) size);
        assert_memory_equal(buf, expected, size);
}

static void test_stream_call_and_reply_write_what_the_formatters_write(void **state) {
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s, s:i, s:[b]}", "lane", "m\"erge\n", "slots", 2, "x", 1);
        const VarlinkCallFlags call_flags[] = { 0, VARLINK_CALL_MORE, VARLINK_CALL_ONEWAY, VARLINK_CALL_UPGRADE,
                                                VARLINK_CALL_MORE | VARLINK_CALL_UPGRADE };
        VarlinkStream s;
        int sv[2];

        socketpair_nonblock(sv);
        varlink_stream_init(&s, sv[0], 0, 0);
        for (size_t i = 0; i < ELEMENTSOF(call_flags); i++)
                for (int with = 0; with < 2; with++) {
                        _cleanup_free_ char *text = NULL;
                        size_t n = 0;
                        assert_int_equal(varlink_call_format("io.slotbroker.Acquire", with ? p : NULL, call_flags[i], &text, &n), 0);
                        assert_int_equal(varlink_stream_call(&s, "io.slotbroker.Acquire", with ? p : NULL, call_flags[i]), 0);
                        assert_stream_bytes(&s, sv[1], text, n);
                        /* The same parameters as text already written (a client's Acquire and Release). */
                        _cleanup_free_ char *params = NULL;
                        size_t np = 2;
                        if (with)
                                assert_int_equal(json_format(p, &params, &np), 0);
                        assert_int_equal(varlink_stream_call_text(&s, "io.slotbroker.Acquire", with ? params : "{}", np,
                                                                  call_flags[i], NULL, 0), 0);
                        assert_stream_bytes(&s, sv[1], text, n);
                }
        for (int continues = 0; continues < 2; continues++)
                for (int with = 0; with < 2; with++) {
                        _cleanup_free_ char *text = NULL;
                        size_t n = 0;
                        VarlinkReplyFlags f = continues ? VARLINK_REPLY_CONTINUES : 0;
                        assert_int_equal(varlink_reply_format(with ? p : NULL, f, &text, &n), 0);
                        assert_int_equal(varlink_stream_reply(&s, with ? p : NULL, f), 0);
                        assert_stream_bytes(&s, sv[1], text, n);
                        /* The same parameters as text already written (the grant's reply). */
                        _cleanup_free_ char *params = NULL;
                        size_t np = 2;
                        if (with)
                                assert_int_equal(json_format(p, &params, &np), 0);
                        assert_int_equal(varlink_stream_reply_text(&s, with ? params : "{}", np, f), 0);
                        assert_stream_bytes(&s, sv[1], text, n);
                }

        /* What the builders refuse, they still refuse, and nothing is queued. */
        _cleanup_(json_decrefp) json_t *array = json_array();
        assert_int_equal(varlink_stream_call(&s, "a.b.c", NULL, 0), -EINVAL);
        assert_int_equal(varlink_stream_call(&s, "a.b.C", NULL, VARLINK_CALL_MORE | VARLINK_CALL_ONEWAY), -EINVAL);
        assert_int_equal(varlink_stream_call(&s, "a.b.C", array, 0), -EINVAL);
        assert_int_equal(varlink_stream_reply(&s, array, 0), -EINVAL);
        assert_int_equal(varlink_stream_reply(&s, NULL, 1 << 5), -EINVAL);
        assert_int_equal(varlink_stream_reply_text(&s, "[]", 2, 0), -EINVAL);
        assert_int_equal(varlink_stream_reply_text(&s, "{\"a\":\"\0\"}", 8, 0), -EINVAL);
        assert_int_equal(varlink_stream_reply_text(&s, "{}", 2, 1 << 5), -EINVAL);
        assert_int_equal(varlink_stream_call_text(&s, "a.b.c", "{}", 2, 0, NULL, 0), -EINVAL);
        assert_int_equal(varlink_stream_call_text(&s, "a.b.C", "[]", 2, 0, NULL, 0), -EINVAL);
        assert_int_equal(varlink_stream_call_text(&s, "a.b.C", "{\"a\":\"\0\"}", 8, 0, NULL, 0), -EINVAL);
        assert_int_equal(varlink_stream_call_text(&s, "a.b.C", "{}", 2, VARLINK_CALL_MORE | VARLINK_CALL_ONEWAY, NULL, 0),
                         -EINVAL);
        assert_int_equal(varlink_stream_call_text(&s, "a.b.C", "{}", 2, 0, NULL, 1), -EINVAL);
        assert_int_equal(s.output.pending, 0);
        varlink_stream_done(&s);
        safe_close(sv[0]);
        safe_close(sv[1]);
}

static void test_error_format_writes_error_and_parameters(void **state) {
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:i, s:s}", "retryAfterSec", 12, "pool", "grid");
        _cleanup_free_ char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;

        assert_int_equal(varlink_error_format("io.slotbroker.Busy", p, &a, &na), 0);
        assert_bytes(a, na, "{\"error\":\"io.slotbroker.Busy\",\"parameters\":{\"retryAfterSec\":12,\"pool\":\"grid\"}}");
        assert_int_equal(varlink_error_format(VARLINK_ERROR_EXPECTED_MORE, NULL, &b, &nb), 0);
        assert_bytes(b, nb, "{\"error\":\"org.varlink.service.ExpectedMore\",\"parameters\":{}}");
        assert_int_equal(varlink_error_format("Busy", NULL, &a, &na), -EINVAL);
}

static void test_format_escapes_nul_inside_strings(void **state) {
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s#}", "job", "a\0b", (int) 3);
        _cleanup_free_ char *a = NULL;
        size_t n = 0;

        assert_int_equal(varlink_reply_format(p, 0, &a, &n), 0);
        /* The only NUL is the terminator. */
        assert_ptr_equal(memchr(a, 0, n), a + n - 1);
        assert_bytes(a, n, "{\"parameters\":{\"job\":\"a\\u0000b\"}}");
}

/* ---- input ---- */

static const char two_messages[] =
        "{\"method\":\"io.slotbroker.Acquire\",\"parameters\":{\"lane\":\"merge\"},\"more\":true}\0"
        "{\"method\":\"io.slotbroker.Status\"}";

static void test_input_yields_message_split_at_every_offset(void **state) {
        const size_t total = sizeof(two_messages); /* both NULs */
        const size_t first = strlen(two_messages) + 1;

        for (size_t cut = 0; cut <= total; cut++) {
                VarlinkInput in;
                json_t *m = NULL;
                size_t got = 0;

                varlink_input_init(&in, 0);
                assert_int_equal(varlink_input_feed(&in, two_messages, cut), 0);
                for (;;) {
                        int r = varlink_input_next(&in, &m);
                        assert_true(r >= 0);
                        if (r == 0)
                                break;
                        json_decref(m);
                        got++;
                }
                assert_int_equal(got, cut >= total ? 2 : cut >= first ? 1 : 0);
                assert_int_equal(varlink_input_feed(&in, two_messages + cut, total - cut), 0);
                for (;;) {
                        int r = varlink_input_next(&in, &m);
                        assert_true(r >= 0);
                        if (r == 0)
                                break;
                        if (got == 0)
                                assert_string_equal(json_string_value(json_object_get(m, "method")), "io.slotbroker.Acquire");
                        else
                                assert_string_equal(json_string_value(json_object_get(m, "method")), "io.slotbroker.Status");
                        json_decref(m);
                        got++;
                }
                assert_int_equal(got, 2);
                assert_int_equal(varlink_input_pending(&in), 0);
                varlink_input_done(&in);
        }
}

static void test_input_yields_message_fed_byte_by_byte(void **state) {
        VarlinkInput in;
        size_t got = 0;

        varlink_input_init(&in, 0);
        for (size_t i = 0; i < sizeof(two_messages); i++) {
                assert_int_equal(varlink_input_feed(&in, two_messages + i, 1), 0);
                json_t *m = NULL;
                int r = varlink_input_next(&in, &m);
                assert_true(r >= 0);
                if (r > 0) {
                        json_decref(m);
                        got++;
                }
        }
        assert_int_equal(got, 2);
        varlink_input_done(&in);
}

static void test_input_yields_many_messages_from_one_chunk(void **state) {
        /* 200000 messages in one chunk: a quadratic buffer would take minutes here. */
        const char msg[] = "{\"parameters\":{}}";
        const size_t n = 200000, each = sizeof(msg);
        _cleanup_free_ char *chunk = malloc(n * each);
        VarlinkInput in;

        assert_non_null(chunk);
        for (size_t i = 0; i < n; i++)
                memcpy(chunk + i * each, msg, each);
        varlink_input_init(&in, 0);
        assert_int_equal(varlink_input_feed(&in, chunk, n * each), 0);
        assert_int_equal(take_all(&in, msg), n);
        assert_int_equal(varlink_input_pending(&in), 0);
        varlink_input_done(&in);
}

static void test_input_accepts_message_of_exactly_max(void **state) {
        VarlinkInput in;
        const char msg[] = "{\"a\":\"0123\"}"; /* 12 bytes */

        varlink_input_init(&in, strlen(msg));
        assert_int_equal(varlink_input_feed(&in, msg, sizeof(msg)), 0);
        assert_int_equal(take_all(&in, msg), 1);
        varlink_input_done(&in);
}

static void test_input_refuses_oversize_without_nul(void **state) {
        VarlinkInput in;
        const char msg[] = "{\"a\":\"01234\"}"; /* 13 bytes */
        json_t *m = NULL;

        varlink_input_init(&in, 12);
        assert_int_equal(varlink_input_feed(&in, msg, 12), 0);
        assert_int_equal(varlink_input_next(&in, &m), 0); /* 12 bytes could still end */
        assert_int_equal(varlink_input_feed(&in, msg + 12, 1), 0);
        assert_int_equal(varlink_input_next(&in, &m), -EMSGSIZE);
        /* It stays refused: the connection is to be closed. */
        assert_int_equal(varlink_input_feed(&in, "", 1), 0);
        assert_int_equal(varlink_input_next(&in, &m), -EMSGSIZE);
        assert_null(m);
        varlink_input_done(&in);
}

static void test_input_refuses_oversize_with_nul(void **state) {
        VarlinkInput in;
        const char msg[] = "{\"a\":\"01234\"}";
        json_t *m = NULL;

        varlink_input_init(&in, 12);
        assert_int_equal(varlink_input_feed(&in, msg, sizeof(msg)), 0);
        assert_int_equal(varlink_input_next(&in, &m), -EMSGSIZE);
        assert_null(m);
        varlink_input_done(&in);
}

static void test_input_default_cap_is_64k(void **state) {
        VarlinkInput in;
        json_t *m = NULL;
        _cleanup_free_ char *big = malloc(VARLINK_CALL_MAX_DEFAULT + 1);

        assert_non_null(big);
        memset(big, ' ', VARLINK_CALL_MAX_DEFAULT + 1);
        varlink_input_init(&in, 0);
        assert_int_equal(varlink_input_feed(&in, big, VARLINK_CALL_MAX_DEFAULT), 0);
        assert_int_equal(varlink_input_next(&in, &m), 0);
        assert_int_equal(varlink_input_feed(&in, big, 1), 0);
        assert_int_equal(varlink_input_next(&in, &m), -EMSGSIZE);
        varlink_input_done(&in);
}

static void test_input_drops_malformed_json_and_continues(void **state) {
        VarlinkInput in;
        json_t *m = NULL;
        static const char chunk[] = "{\"method\":}\0{\"parameters\":{}}";

        varlink_input_init(&in, 0);
        assert_int_equal(varlink_input_feed(&in, chunk, sizeof(chunk)), 0);
        assert_int_equal(varlink_input_next(&in, &m), -EBADMSG);
        assert_null(m);
        assert_int_equal(take_all(&in, "{\"parameters\":{}}"), 1);
        varlink_input_done(&in);
}

static void test_input_refuses_non_object(void **state) {
        static const char *const bad[] = { "[]", "1", "\"x\"", "null", "true" };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
                VarlinkInput in;
                json_t *m = NULL;

                varlink_input_init(&in, 0);
                assert_int_equal(varlink_input_feed(&in, bad[i], strlen(bad[i]) + 1), 0);
                assert_int_equal(varlink_input_next(&in, &m), -EBADMSG);
                assert_null(m);
                varlink_input_done(&in);
        }
}

static void test_input_refuses_empty_message(void **state) {
        VarlinkInput in;
        json_t *m = NULL;

        varlink_input_init(&in, 0);
        assert_int_equal(varlink_input_feed(&in, "\0", 1), 0);
        assert_int_equal(varlink_input_next(&in, &m), -EBADMSG);
        varlink_input_done(&in);
}

static void test_input_gives_memory_back_when_empty(void **state) {
        VarlinkInput in;

        varlink_input_init(&in, 0);
        assert_int_equal(varlink_input_feed(&in, "{}\0{", 4), 0);
        assert_int_equal(take_all(&in, "{}"), 1);
        assert_non_null(in.data); /* "{" is still pending */
        assert_int_equal(varlink_input_feed(&in, "}", 2), 0);
        assert_int_equal(take_all(&in, "{}"), 1);
        assert_null(in.data);
        assert_int_equal(in.allocated, 0);
        varlink_input_done(&in);
}

static void test_input_shrinks_after_a_large_message(void **state) {
        VarlinkInput in;
        const size_t n = 1 << 20;
        _cleanup_free_ char *big = malloc(n + 16);
        json_t *m = NULL;

        assert_non_null(big);
        char *p = stpcpy(big, "{\"a\":\"");
        memset(p, 'x', n);
        p = stpcpy(p + n, "\"}");
        *p++ = 0;
        *p++ = '{'; /* the start of the next message */
        varlink_input_init(&in, VARLINK_REPLY_MAX_DEFAULT);
        assert_int_equal(varlink_input_feed(&in, big, p - big), 0);
        assert_int_equal(varlink_input_next(&in, &m), 1);
        json_decref(m);
        assert_true(in.allocated > n);
        assert_int_equal(varlink_input_feed(&in, "}", 2), 0);
        assert_true(in.allocated <= 2 * VARLINK_READ_SIZE);
        assert_int_equal(take_all(&in, "{}"), 1);
        varlink_input_done(&in);
}

/* ---- output ---- */

static void test_output_refuses_past_cap(void **state) {
        VarlinkOutput out;
        char buf[100] = {};

        varlink_output_init(&out, 100);
        assert_int_equal(varlink_output_enqueue(&out, buf, 60), 0);
        assert_int_equal(varlink_output_enqueue(&out, buf, 41), -ENOBUFS);
        assert_int_equal(varlink_output_pending(&out), 60);
        assert_int_equal(varlink_output_enqueue(&out, buf, 40), 0);
        assert_int_equal(varlink_output_pending(&out), 100);
        assert_int_equal(varlink_output_enqueue(&out, buf, 1), -ENOBUFS);
        assert_int_equal(varlink_output_pending(&out), 100);
        varlink_output_done(&out);
}

static void test_output_json_past_cap_leaves_queue_as_it_was(void **state) {
        VarlinkOutput out;
        int sv[2];
        char got[256];
        _cleanup_(json_decrefp) json_t *small = parse("{\"parameters\":{}}");
        _cleanup_(json_decrefp) json_t *big = json_pack("{s:s}", "parameters",
                "a string long enough to go past the cap halfway through its serialization....");

        socketpair_nonblock(sv);
        varlink_output_init(&out, 60);
        assert_int_equal(varlink_output_enqueue_json(&out, small), 0);
        assert_int_equal(varlink_output_pending(&out), 18);
        assert_int_equal(varlink_output_enqueue_json(&out, big), -ENOBUFS);
        assert_int_equal(varlink_output_pending(&out), 18);
        assert_int_equal(varlink_output_enqueue_json(&out, small), 0);
        assert_int_equal(varlink_output_flush(&out, sv[0]), 0);
        assert_int_equal(recv(sv[1], got, sizeof(got), 0), 36);
        assert_memory_equal(got, "{\"parameters\":{}}\0{\"parameters\":{}}\0", 36);
        varlink_output_done(&out);
        safe_close(sv[0]);
        safe_close(sv[1]);
}

static void count_release(void *userdata) {
        (*(unsigned *) userdata)++;
}

/* Bytes queued by reference go out in order among copied ones, partial writes included, and are released once,
 * when sent; past the cap nothing is queued and nothing released; what the queue drops unsent is released. */
static void test_output_shared_bytes_are_sent_then_released(void **state) {
        VarlinkOutput out;
        int sv[2];
        char text[] = "shared text\0", got[64];
        unsigned released = 0, dropped = 0;

        socketpair_nonblock(sv);
        varlink_output_init(&out, 64);
        assert_int_equal(varlink_output_enqueue(&out, "a\0", 2), 0);
        assert_int_equal(varlink_output_enqueue_shared(&out, text, sizeof text - 1, count_release, &released), 0);
        assert_int_equal(varlink_output_enqueue(&out, "b\0", 2), 0); /* a chunk after it: nothing appended to it */
        assert_int_equal(varlink_output_enqueue_shared(&out, text, 64, count_release, &released), -ENOBUFS);
        assert_int_equal(varlink_output_pending(&out), 16);
        assert_int_equal(varlink_output_flush(&out, sv[0]), 0);
        assert_int_equal(released, 1);
        assert_int_equal(recv(sv[1], got, sizeof got, 0), 16);
        assert_memory_equal(got, "a\0shared text\0b\0", 16);

        assert_int_equal(varlink_output_enqueue_shared(&out, text, sizeof text - 1, count_release, &dropped), 0);
        varlink_output_done(&out);
        assert_int_equal(dropped, 1);
        assert_int_equal(released, 1);
        safe_close(sv[0]);
        safe_close(sv[1]);
}

static void test_output_refused_message_frees_its_chunks(void **state) {
        VarlinkOutput out;
        const size_t n = 5000;
        _cleanup_free_ char *s = malloc(n + 1);

        assert_non_null(s);
        memset(s, 'x', n);
        s[n] = 0;
        _cleanup_(json_decrefp) json_t *m = json_pack("{s:s}", "parameters", s);
        _cleanup_(json_decrefp) json_t *small = parse("{\"parameters\":{}}");

        /* Refused only at its last bytes, after it filled new chunks: into an empty queue, then behind a
         * message that stays. */
        varlink_output_init(&out, n + 10);
        assert_int_equal(varlink_output_enqueue_json(&out, m), -ENOBUFS);
        assert_int_equal(varlink_output_pending(&out), 0);
        assert_null(out.head);
        assert_null(out.tail);
        assert_int_equal(varlink_output_enqueue_json(&out, small), 0);
        assert_int_equal(varlink_output_enqueue_json(&out, m), -ENOBUFS);
        assert_int_equal(varlink_output_pending(&out), 18);
        assert_ptr_equal(out.head, out.tail);
        varlink_output_done(&out);
}

static void test_output_spans_chunks_for_large_messages(void **state) {
        VarlinkOutput out;
        int sv[2];
        const size_t n = 10000;
        _cleanup_free_ char *s = malloc(n + 1), *got = malloc(n + 64);

        assert_non_null(s);
        assert_non_null(got);
        memset(s, 'x', n);
        s[n] = 0;
        _cleanup_(json_decrefp) json_t *m = json_pack("{s:{s:s}}", "parameters", "s", s);
        socketpair_nonblock(sv);
        int size = 1 << 20;
        assert_int_equal(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &size, sizeof(size)), 0);
        varlink_output_init(&out, 0);
        assert_int_equal(varlink_output_enqueue(&out, "{}", 3), 0);
        assert_int_equal(varlink_output_enqueue_json(&out, m), 0);
        assert_int_equal(varlink_output_flush(&out, sv[0]), 0);
        assert_null(out.head);

        VarlinkInput in;
        varlink_input_init(&in, 0);
        ssize_t k;
        while ((k = recv(sv[1], got, n + 64, 0)) > 0)
                assert_int_equal(varlink_input_feed(&in, got, k), 0);
        json_t *back = NULL;
        assert_int_equal(varlink_input_next(&in, &back), 1);
        assert_int_equal(json_object_size(back), 0);
        json_decref(back);
        assert_int_equal(varlink_input_next(&in, &back), 1);
        assert_true(json_equal(back, m));
        json_decref(back);
        assert_int_equal(varlink_input_next(&in, &back), 0);
        varlink_input_done(&in);
        varlink_output_done(&out);
        safe_close(sv[0]);
        safe_close(sv[1]);
}

static void test_output_message_in_parts(void **state) {
        VarlinkOutput out;
        int sv[2];
        char got[256];
        _cleanup_(json_decrefp) json_t *a = parse("{\"id\":1,\"job\":\"x\"}");
        _cleanup_(json_decrefp) json_t *b = json_integer(7);

        socketpair_nonblock(sv);
        varlink_output_init(&out, 0);
        assert_int_equal(varlink_output_enqueue(&out, "{\"parameters\":{\"events\":[", 25), 0);
        assert_int_equal(varlink_output_enqueue_json_part(&out, a), 0);
        assert_int_equal(varlink_output_enqueue(&out, ",", 1), 0);
        assert_int_equal(varlink_output_enqueue_json_part(&out, b), 0); /* not an object: fine in a part */
        assert_int_equal(varlink_output_enqueue(&out, "]}}", 4), 0);
        assert_int_equal(varlink_output_flush(&out, sv[0]), 0);
        ssize_t k = recv(sv[1], got, sizeof(got), 0);
        static const char want[] = "{\"parameters\":{\"events\":[{\"id\":1,\"job\":\"x\"},7]}}";
        assert_int_equal(k, sizeof want);
        assert_memory_equal(got, want, sizeof want);
        varlink_output_done(&out);
        safe_close(sv[0]);
        safe_close(sv[1]);
}

/* ---- stream ---- */

static void test_stream_round_trip_over_socketpair(void **state) {
        int sv[2];
        VarlinkStream client, server;
        json_t *m = NULL;
        VarlinkCall call;
        VarlinkReply reply;

        socketpair_nonblock(sv);
        varlink_stream_init(&client, sv[0], VARLINK_REPLY_MAX_DEFAULT, 0);
        varlink_stream_init(&server, sv[1], 0, 0);

        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "lane", "merge");
        assert_int_equal(varlink_stream_call(&client, "io.slotbroker.Acquire", p, VARLINK_CALL_MORE), 0);
        assert_int_equal(varlink_stream_flush(&client), 0);

        assert_true(varlink_stream_read(&server) > 0);
        assert_int_equal(varlink_stream_next(&server, &m), 1);
        assert_int_equal(tree_call_parse(m, &call), 0);
        assert_string_equal(call.method, "io.slotbroker.Acquire");
        assert_int_equal(call.flags, VARLINK_CALL_MORE);
        json_decref(m);

        _cleanup_(json_decrefp) json_t *q = json_pack("{s:s, s:i}", "state", "queued", "position", 1);
        assert_int_equal(varlink_stream_reply(&server, q, VARLINK_REPLY_CONTINUES), 0);
        assert_int_equal(varlink_stream_reply_error_string(&server, VARLINK_ERROR_INVALID_PARAMETER, "parameter", "slots"), 0);
        assert_int_equal(varlink_stream_flush(&server), 0);

        assert_true(varlink_stream_read(&client) > 0);
        assert_int_equal(varlink_stream_next(&client, &m), 1);
        assert_int_equal(tree_reply_parse(m, &reply), 0);
        assert_int_equal(reply.flags, VARLINK_REPLY_CONTINUES);
        assert_int_equal(json_integer_value(json_object_get(reply.parameters, "position")), 1);
        json_decref(m);
        assert_int_equal(varlink_stream_next(&client, &m), 1);
        assert_int_equal(tree_reply_parse(m, &reply), 0);
        assert_string_equal(reply.error, VARLINK_ERROR_INVALID_PARAMETER);
        assert_string_equal(json_string_value(json_object_get(reply.parameters, "parameter")), "slots");
        json_decref(m);
        assert_int_equal(varlink_stream_next(&client, &m), 0);

        varlink_stream_done(&client);
        varlink_stream_done(&server);
        safe_close(sv[0]);
        safe_close(sv[1]);
}

static void test_stream_keeps_partial_writes_for_a_slow_reader(void **state) {
        int sv[2];
        VarlinkStream writer;
        VarlinkInput reader;
        const size_t n_messages = 300;
        size_t received = 0, rounds = 0;
        bool saw_split_message = false, saw_eagain = false;
        _cleanup_free_ char *filler = malloc(1001);

        assert_non_null(filler);
        memset(filler, 'f', 1000);
        filler[1000] = 0;
        socketpair_nonblock(sv);
        int size = 4096;
        assert_int_equal(setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &size, sizeof(size)), 0);
        assert_int_equal(setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &size, sizeof(size)), 0);

        varlink_stream_init(&writer, sv[0], 0, 0);
        varlink_input_init(&reader, 0);
        for (size_t i = 0; i < n_messages; i++) {
                /* Three digits each, so that every message has the same size. */
                _cleanup_(json_decrefp) json_t *p = json_pack("{s:I, s:s}", "seq", (json_int_t) (100 + i), "filler", filler);
                assert_int_equal(varlink_stream_reply(&writer, p, VARLINK_REPLY_CONTINUES), 0);
        }
        const size_t each = varlink_stream_pending_output(&writer) / n_messages;

        while (received < n_messages) {
                assert_true(++rounds < 1000000);

                int r = varlink_stream_flush(&writer);
                if (r == -EAGAIN) {
                        saw_eagain = true;
                        assert_true(varlink_stream_pending_output(&writer) > 0);
                        if (varlink_stream_pending_output(&writer) % each != 0)
                                saw_split_message = true;
                } else
                        assert_int_equal(r, 0);

                /* The reader takes 100 bytes at a time. */
                char buf[100];
                ssize_t k = recv(sv[1], buf, sizeof(buf), 0);
                if (k < 0) {
                        assert_int_equal(errno, EAGAIN);
                        continue;
                }
                assert_true(k > 0);
                assert_int_equal(varlink_input_feed(&reader, buf, k), 0);
                for (;;) {
                        json_t *m = NULL;
                        VarlinkReply reply;
                        r = varlink_input_next(&reader, &m);
                        assert_true(r >= 0);
                        if (r == 0)
                                break;
                        assert_int_equal(tree_reply_parse(m, &reply), 0);
                        assert_int_equal(json_integer_value(json_object_get(reply.parameters, "seq")), 100 + received);
                        assert_string_equal(json_string_value(json_object_get(reply.parameters, "filler")), filler);
                        json_decref(m);
                        received++;
                }
        }
        assert_true(saw_eagain);
        assert_true(saw_split_message);
        assert_int_equal(varlink_stream_pending_output(&writer), 0);
        assert_null(writer.output.head);

        varlink_input_done(&reader);
        varlink_stream_done(&writer);
        safe_close(sv[0]);
        safe_close(sv[1]);
}

static void test_stream_read_returns_eagain_when_nothing_is_there(void **state) {
        int sv[2];
        VarlinkStream s;

        socketpair_nonblock(sv);
        varlink_stream_init(&s, sv[0], 0, 0);
        assert_int_equal(varlink_stream_read(&s), -EAGAIN);
        assert_null(s.input.data); /* an idle connection keeps no buffer */
        varlink_stream_done(&s);
        safe_close(sv[0]);
        safe_close(sv[1]);
}

static void test_stream_read_does_not_block_on_blocking_socket(void **state) {
        int sv[2];
        VarlinkStream s;

        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        varlink_stream_init(&s, sv[0], 0, 0);
        assert_int_equal(varlink_stream_read(&s), -EAGAIN);
        varlink_stream_done(&s);
        safe_close(sv[0]);
        safe_close(sv[1]);
}

static void test_stream_read_returns_zero_at_eof(void **state) {
        int sv[2];
        VarlinkStream s;
        json_t *m = NULL;

        socketpair_nonblock(sv);
        varlink_stream_init(&s, sv[0], 0, 0);
        assert_int_equal(send(sv[1], "{}", 3, 0), 3);
        sv[1] = safe_close(sv[1]);
        assert_int_equal(varlink_stream_read(&s), 3);
        assert_int_equal(varlink_stream_next(&s, &m), 1);
        json_decref(m);
        assert_int_equal(varlink_stream_read(&s), 0);
        assert_int_equal(varlink_stream_pending_input(&s), 0);
        varlink_stream_done(&s);
        safe_close(sv[0]);
}

static void test_stream_eof_inside_message_leaves_pending_input(void **state) {
        int sv[2];
        VarlinkStream s;
        json_t *m = NULL;

        socketpair_nonblock(sv);
        varlink_stream_init(&s, sv[0], 0, 0);
        assert_int_equal(send(sv[1], "{\"method\":", 10, 0), 10);
        sv[1] = safe_close(sv[1]);
        assert_int_equal(varlink_stream_read(&s), 10);
        assert_int_equal(varlink_stream_next(&s, &m), 0);
        assert_int_equal(varlink_stream_read(&s), 0);
        assert_int_equal(varlink_stream_pending_input(&s), 10); /* truncated: the caller knows */
        varlink_stream_done(&s);
        safe_close(sv[0]);
}

static void test_stream_flush_to_closed_peer_fails_without_sigpipe(void **state) {
        int sv[2];
        VarlinkStream s;

        socketpair_nonblock(sv);
        varlink_stream_init(&s, sv[0], 0, 0);
        sv[1] = safe_close(sv[1]);
        assert_int_equal(varlink_stream_reply(&s, NULL, 0), 0);
        /* SIGPIPE is not ignored here: MSG_NOSIGNAL alone keeps the test alive. */
        assert_int_equal(varlink_stream_flush(&s), -EPIPE);
        varlink_stream_done(&s);
        safe_close(sv[0]);
}

static void test_stream_read_refuses_when_messages_are_not_taken(void **state) {
        int sv[2];
        VarlinkStream s;
        json_t *m = NULL;
        const char burst[] = "{}\0{}\0{}\0{}\0{}\0{}\0{}\0{}\0{}\0{}";

        socketpair_nonblock(sv);
        varlink_stream_init(&s, sv[0], 8, 0);
        assert_int_equal(send(sv[1], burst, sizeof(burst), 0), (ssize_t) sizeof(burst));
        /* At most one message's worth (8 bytes and a NUL) per read beyond what is buffered. */
        assert_int_equal(varlink_stream_read(&s), 9);
        assert_int_equal(varlink_stream_read(&s), -ENOBUFS);
        size_t taken = 0;
        for (;;) {
                ssize_t k;
                while (varlink_stream_next(&s, &m) > 0) {
                        json_decref(m);
                        taken++;
                }
                k = varlink_stream_read(&s);
                if (k == -EAGAIN)
                        break;
                assert_true(k > 0 && k <= 9);
        }
        assert_int_equal(taken, 10);
        varlink_stream_done(&s);
        safe_close(sv[0]);
        safe_close(sv[1]);
}

static void test_stream_refuses_oversize_message_from_socket(void **state) {
        int sv[2];
        VarlinkStream s;
        json_t *m = NULL;
        char junk[64];
        ssize_t k;
        int r = 0;

        memset(junk, ' ', sizeof(junk));
        socketpair_nonblock(sv);
        varlink_stream_init(&s, sv[0], 32, 0);
        assert_int_equal(send(sv[1], junk, sizeof(junk), 0), (ssize_t) sizeof(junk));
        while ((k = varlink_stream_read(&s)) > 0 && (r = varlink_stream_next(&s, &m)) == 0)
                ;
        assert_true(k > 0);
        assert_int_equal(r, -EMSGSIZE);
        assert_int_equal(varlink_stream_read(&s), -ENOBUFS);
        varlink_stream_done(&s);
        safe_close(sv[0]);
        safe_close(sv[1]);
}

/* ---- file descriptors passed with messages ---- */

/* A pipe whose write end is passed around: its read end says whether any copy of the write end is still open
 * anywhere (EAGAIN) or every one was closed (EOF), which is how the tests see that no fd leaked. */
typedef struct Probe {
        int read_fd;
        int write_fd;
} Probe;

static Probe probe_new(void) {
        int p[2];
        assert_int_equal(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
        return (Probe) { .read_fd = p[0], .write_fd = p[1] };
}

/* Closes our own write end; afterwards probe_open() tells whether a passed copy is still open. */
static void probe_drop_ours(Probe *p) {
        p->write_fd = safe_close(p->write_fd);
}

static bool probe_open(const Probe *p) {
        char c;
        ssize_t k = read(p->read_fd, &c, 1);
        if (k < 0) {
                assert_int_equal(errno, EAGAIN);
                return true;
        }
        assert_int_equal(k, 0);
        return false;
}

static void probe_done(Probe *p) {
        safe_close(p->read_fd);
        safe_close(p->write_fd);
}

static bool same_file(int a, int b) {
        struct stat sa, sb;
        assert_int_equal(fstat(a, &sa), 0);
        assert_int_equal(fstat(b, &sb), 0);
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* A stream reading one end of a socketpair (sv[1]), the other end (sv[0]) for send_with_fds(), and a probe
 * whose write end is the fd sent. */
typedef struct FdsCase {
        int sv[2];
        VarlinkStream s;
        Probe probe;
} FdsCase;

static void fds_case_init(FdsCase *t, bool accept_fds) {
        t->probe = probe_new();
        socketpair_nonblock(t->sv);
        varlink_stream_init(&t->s, t->sv[1], 0, 0);
        if (accept_fds)
                varlink_stream_accept_fds(&t->s, true);
}

/* Also after a varlink_stream_done() of the test's own: it may be called again. */
static void fds_case_done(FdsCase *t) {
        varlink_stream_done(&t->s);
        safe_close(t->sv[0]);
        safe_close(t->sv[1]);
        probe_done(&t->probe);
}

/* Reads and takes messages until `want` were taken: msgs[i] and the fds that came with it, fds[i]. */
static void read_messages_with_fds(VarlinkStream *s, size_t want, json_t **msgs, VarlinkFds *fds) {
        size_t taken = 0;
        for (int rounds = 0; taken < want; rounds++) {
                assert_true(rounds < 1000);
                fds[taken] = VARLINK_FDS_INIT;
                int r = varlink_stream_next_with_fds(s, &msgs[taken], &fds[taken]);
                assert_true(r >= 0);
                if (r > 0) {
                        taken++;
                        continue;
                }
                assert_int_equal(fds[taken].n, 0);
                ssize_t k = varlink_stream_read(s);
                assert_true(k > 0);
        }
}

static void check_fds_arrive_with_their_message(size_t max_message) {
        int sv[2];
        VarlinkStream client, server;
        json_t *msgs[3];
        VarlinkFds fds[3];
        Probe probe = probe_new();

        socketpair_nonblock(sv);
        varlink_stream_init(&client, sv[0], 0, 0);
        varlink_stream_init(&server, sv[1], max_message, 0);
        varlink_stream_accept_fds(&server, true);

        /* Three calls queued before one flush: the one with the fd goes out alone, whatever surrounds it. */
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "lane", "merge");
        _cleanup_(json_decrefp) json_t *q = json_pack("{s:s, s:i}", "lane", "nightly", "pidfd", 0);
        assert_int_equal(varlink_stream_call(&client, "io.slotbroker.Status", NULL, 0), 0);
        /* The call with the fd written as text, as a client writes it: the call of the tree's. */
        const char *q_text = "{\"lane\":\"nightly\",\"pidfd\":0}";
        assert_int_equal(varlink_stream_call_text(&client, "io.slotbroker.Acquire", q_text, strlen(q_text),
                                                  VARLINK_CALL_MORE, &probe.write_fd, 1), 0);
        assert_int_equal(varlink_stream_call(&client, "io.slotbroker.Acquire", p, 0), 0);
        assert_int_equal(varlink_stream_flush(&client), 0);
        probe_drop_ours(&probe);
        assert_true(probe_open(&probe)); /* the copy in flight, then the server's */

        read_messages_with_fds(&server, 3, msgs, fds);
        assert_int_equal(fds[0].n, 0);
        assert_int_equal(fds[1].n, 1);
        assert_int_equal(fds[2].n, 0);
        _cleanup_(json_decrefp) json_t *q_call = NULL;
        assert_int_equal(varlink_call_new("io.slotbroker.Acquire", q, VARLINK_CALL_MORE, &q_call), 0);
        assert_true(json_equal(msgs[1], q_call));
        assert_true(same_file(fds[1].fds[0], probe.read_fd));
        assert_true(fcntl(fds[1].fds[0], F_GETFD) & FD_CLOEXEC);
        assert_true(probe_open(&probe));

        int fd = varlink_fds_take(&fds[1], 0);
        assert_true(fd >= 0);
        assert_int_equal(varlink_fds_take(&fds[1], 0), -ENXIO); /* taken */
        assert_int_equal(varlink_fds_take(&fds[1], 1), -ENXIO); /* never there */
        varlink_fds_close(&fds[1]);
        assert_true(probe_open(&probe)); /* the taker's now */
        safe_close(fd);
        assert_false(probe_open(&probe));

        for (size_t i = 0; i < 3; i++)
                json_decref(msgs[i]);
        varlink_stream_done(&client);
        varlink_stream_done(&server);
        safe_close(sv[0]);
        safe_close(sv[1]);
        probe_done(&probe);
}

static void test_fds_arrive_with_their_message(void **state) {
        check_fds_arrive_with_their_message(0);
}

static void test_fds_arrive_with_their_message_across_short_reads(void **state) {
        /* 100 bytes a message at most: a read takes at most 101 bytes beyond those buffered, so the first
         * read ends inside the second message (the calls are about 50, 90 and 65 bytes long). */
        check_fds_arrive_with_their_message(100);
}

static void test_fds_of_a_message_taken_without_them_are_closed(void **state) {
        FdsCase t;
        json_t *m = NULL;

        fds_case_init(&t, true);
        send_with_fds(t.sv[0], "{\"method\":\"io.slotbroker.Status\"}", t.probe.write_fd, 2);
        probe_drop_ours(&t.probe);
        assert_true(varlink_stream_read(&t.s) > 0);
        assert_true(probe_open(&t.probe));
        assert_int_equal(varlink_stream_next(&t.s, &m), 1);
        assert_false(probe_open(&t.probe));
        json_decref(m);
        fds_case_done(&t);
}

static void test_fds_of_a_malformed_message_are_closed(void **state) {
        FdsCase t;
        json_t *m = NULL;
        VarlinkFds fds = VARLINK_FDS_INIT;

        fds_case_init(&t, true);
        send_with_fds(t.sv[0], "{not json", t.probe.write_fd, 1);
        probe_drop_ours(&t.probe);
        assert_true(varlink_stream_read(&t.s) > 0);
        assert_int_equal(varlink_stream_next_with_fds(&t.s, &m, &fds), -EBADMSG);
        assert_int_equal(fds.n, 0);
        assert_false(probe_open(&t.probe));
        fds_case_done(&t);
}

static void test_fds_beyond_the_cap_of_one_read_are_refused_and_closed(void **state) {
        FdsCase t;

        fds_case_init(&t, true);
        send_with_fds(t.sv[0], "{\"method\":\"io.slotbroker.Status\"}", t.probe.write_fd, VARLINK_FDS_MAX + 3);
        probe_drop_ours(&t.probe);
        assert_int_equal(varlink_stream_read(&t.s), -ETOOMANYREFS);
        /* Those that fit were closed by us, the rest by the kernel. */
        assert_false(probe_open(&t.probe));
        fds_case_done(&t);
}

static void test_fds_waiting_in_the_input_are_capped(void **state) {
        FdsCase t;
        ssize_t k;

        fds_case_init(&t, true);
        /* Pipelined calls, each with fds, none taken yet: a client must not make us hold fds in bulk. */
        for (int i = 0; i < 3; i++)
                send_with_fds(t.sv[0], "{\"method\":\"io.slotbroker.Status\"}", t.probe.write_fd, VARLINK_FDS_MAX / 2);
        probe_drop_ours(&t.probe);
        while ((k = varlink_stream_read(&t.s)) > 0)
                ;
        assert_int_equal(k, -ETOOMANYREFS);
        assert_true(t.s.input.fds.n <= VARLINK_FDS_MAX);
        varlink_stream_done(&t.s);
        assert_false(probe_open(&t.probe));
        fds_case_done(&t);
}

static void test_stream_not_accepting_fds_leaves_none_open(void **state) {
        FdsCase t;
        json_t *m = NULL;

        fds_case_init(&t, false); /* a client's stream: fds are not for it */
        send_with_fds(t.sv[0], "{\"parameters\":{}}", t.probe.write_fd, 1);
        probe_drop_ours(&t.probe);
        assert_true(varlink_stream_read(&t.s) > 0);
        assert_false(probe_open(&t.probe)); /* the kernel dropped it */
        assert_int_equal(varlink_stream_next(&t.s, &m), 1);
        json_decref(m);
        fds_case_done(&t);
}

static void test_input_fds_belong_to_the_message_of_the_last_byte_fed(void **state) {
        VarlinkInput in;
        json_t *m = NULL;
        VarlinkFds fds = VARLINK_FDS_INIT;
        Probe probe = probe_new();

        varlink_input_init(&in, 0);
        int fd = fcntl(probe.write_fd, F_DUPFD_CLOEXEC, 3);
        assert_int_equal(varlink_input_feed_fds(&in, &fd, 1), -EINVAL); /* no byte to carry it: closed */
        assert_int_equal(varlink_input_feed(&in, "{}\0{\"a\":", 8), 0);
        fd = fcntl(probe.write_fd, F_DUPFD_CLOEXEC, 3);
        assert_int_equal(varlink_input_feed_fds(&in, &fd, 1), 0);
        assert_int_equal(varlink_input_feed(&in, "1}\0{}", 5), 0);

        assert_int_equal(varlink_input_next_with_fds(&in, &m, &fds), 1);
        assert_int_equal(fds.n, 0);
        json_decref(m);
        assert_int_equal(varlink_input_next_with_fds(&in, &m, &fds), 1);
        assert_int_equal(fds.n, 1);
        assert_int_equal(json_integer_value(json_object_get(m, "a")), 1);
        json_decref(m);
        varlink_fds_close(&fds);

        /* A partial message's fds wait with it, and go when the input does. */
        fd = fcntl(probe.write_fd, F_DUPFD_CLOEXEC, 3);
        assert_int_equal(varlink_input_feed_fds(&in, &fd, 1), 0);
        assert_int_equal(varlink_input_next_with_fds(&in, &m, &fds), 0);
        probe_drop_ours(&probe);
        assert_true(probe_open(&probe));
        varlink_input_done(&in);
        assert_false(probe_open(&probe));
        probe_done(&probe);
}

static void test_output_sends_a_message_with_fds_in_a_sendmsg_of_its_own(void **state) {
        int sv[2];
        VarlinkOutput out;
        Probe probe = probe_new();
        _cleanup_(json_decrefp) json_t *a = parse("{\"method\":\"a.b.A\"}");
        _cleanup_(json_decrefp) json_t *b = parse("{\"method\":\"a.b.B\"}");
        char buf[256];
        union {
                struct cmsghdr h;
                uint8_t buf[CMSG_SPACE(sizeof(int) * 4)];
        } control;

        socketpair_nonblock(sv);
        varlink_output_init(&out, 0);
        assert_int_equal(varlink_output_enqueue_json(&out, a), 0);
        assert_int_equal(varlink_output_enqueue_json_with_fds(&out, b, &probe.write_fd, 1), 0);
        assert_int_equal(varlink_output_enqueue_json(&out, a), 0);
        int bad = -1;
        assert_int_equal(varlink_output_enqueue_json_with_fds(&out, a, &bad, 1), -EBADF);
        int many[VARLINK_FDS_MAX + 1] = {};
        assert_int_equal(varlink_output_enqueue_json_with_fds(&out, a, many, VARLINK_FDS_MAX + 1), -EINVAL);
        assert_int_equal(varlink_output_pending(&out), 3 * 19);
        assert_int_equal(varlink_output_flush(&out, sv[0]), 0);
        probe_drop_ours(&probe);

        /* The kernel ends a read that brings fds after the bytes they came with: A, then B with the fd. */
        struct iovec iov = { buf, sizeof buf };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = &control, .msg_controllen = sizeof control };
        ssize_t k = recvmsg(sv[1], &mh, MSG_CMSG_CLOEXEC);
        assert_int_equal(k, 2 * 19);
        assert_memory_equal(buf + 19, "{\"method\":\"a.b.B\"}", 19);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        assert_non_null(cm);
        assert_int_equal(cm->cmsg_type, SCM_RIGHTS);
        assert_int_equal(cm->cmsg_len, CMSG_LEN(sizeof(int)));
        int fd;
        memcpy(&fd, CMSG_DATA(cm), sizeof fd);
        assert_true(same_file(fd, probe.read_fd));
        safe_close(fd);
        assert_false(probe_open(&probe)); /* the queue's copy was closed once sent */
        assert_int_equal(recv(sv[1], buf, sizeof buf, 0), 19);

        varlink_output_done(&out);
        safe_close(sv[0]);
        safe_close(sv[1]);
        probe_done(&probe);
}

static void test_output_done_closes_fds_never_sent(void **state) {
        VarlinkOutput out;
        Probe probe = probe_new();
        _cleanup_(json_decrefp) json_t *b = parse("{\"method\":\"a.b.B\"}");

        varlink_output_init(&out, 0);
        assert_int_equal(varlink_output_enqueue_json_with_fds(&out, b, &probe.write_fd, 1), 0);
        probe_drop_ours(&probe);
        assert_true(probe_open(&probe));
        varlink_output_done(&out);
        assert_false(probe_open(&probe));
        probe_done(&probe);
}

/* ---- the interface definition ---- */

static char *read_file(const char *path, size_t *ret_size) {
        FILE *f = fopen(path, "re");
        assert_non_null(f);
        char *buf = malloc(1 << 20);
        assert_non_null(buf);
        size_t n = fread(buf, 1, (1 << 20) - 1, f);
        assert_true(feof(f));
        fclose(f);
        buf[n] = 0;
        *ret_size = n;
        return buf;
}

/* The tests run in tests/ of the source tree. */
#define INTERFACE_FILE "../libbroker/io.slotbroker.varlink"

static void test_embedded_interface_equals_file(void **state) {
        size_t n;
        _cleanup_free_ char *file = read_file(INTERFACE_FILE, &n);

        assert_int_equal(strlen(varlink_interface_io_slotbroker), n);
        assert_memory_equal(varlink_interface_io_slotbroker, file, n);
}

/* A checker for the varlink.org interface grammar (its PEG, no more lenient): members separated by
 * newlines, no space between a field's type and its comma, names as the grammar has them, custom types
 * defined, no name twice. With require_docs, every declaration must be preceded by a comment block that
 * documents each of its fields on a line "#   name: …" — field comments go above the declaration, not
 * between fields, which systemd 255/256's varlinkctl cannot parse. Returns NULL or what is wrong. */
typedef struct Idl {
        const char *p;
        bool require_docs;
        bool documented;       /* the last thing skipped was a comment line directly above */
        const char *doc_start; /* the comment block directly above the current declaration */
        const char *doc_end;
        char names[64][64];
        size_t n_names;
        char refs[64][64];
        size_t n_refs;
        const char *error;
} Idl;

static void idl_skip(Idl *x) {
        unsigned newlines = 0;
        bool comment = false;

        const char *block = NULL;
        for (;;) {
                char c = *x->p;
                if (c == '#') {
                        if (!comment || newlines > 1)
                                block = x->p;
                        while (*x->p && *x->p != '\n')
                                x->p++;
                        comment = true;
                        newlines = 0;
                } else if (c == '\n') {
                        newlines++;
                        x->p++;
                } else if (c == ' ' || c == '\t' || c == '\r')
                        x->p++;
                else
                        break;
        }
        x->documented = comment && newlines <= 1;
        if (x->documented) {
                x->doc_start = block;
                x->doc_end = x->p;
        }
}

/* Is the field documented as "#   name:" in the block above its declaration? */
static bool idl_field_documented(const Idl *x, const char *name) {
        char needle[80];
        snprintf(needle, sizeof needle, "\n#   %s: ", name);
        for (const char *p = x->doc_start; p && p < x->doc_end; p++) {
                p = strstr(p, needle);
                if (!p || p >= x->doc_end)
                        return false;
                return true;
        }
        return false;
}

static bool idl_fail(Idl *x, const char *what) {
        if (!x->error)
                x->error = what;
        return false;
}

static size_t idl_word(Idl *x, char *buf, size_t size) {
        size_t n = 0;
        while ((*x->p >= 'a' && *x->p <= 'z') || (*x->p >= 'A' && *x->p <= 'Z') || (*x->p >= '0' && *x->p <= '9') ||
               *x->p == '_' || *x->p == '-' || *x->p == '.') {
                if (n + 1 < size)
                        buf[n++] = *x->p;
                x->p++;
        }
        buf[n] = 0;
        return n;
}

static bool idl_field_name_valid(const char *s) {
        /* [A-Za-z](_?[A-Za-z0-9])* */
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
                return false;
        for (s++; *s; s++) {
                if (*s == '_')
                        s++;
                if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9')))
                        return false;
        }
        return true;
}

static bool idl_struct_or_enum(Idl *x, bool fields_need_docs);

static bool idl_type(Idl *x) {
        char w[64];

        if (*x->p == '?') {
                x->p++;
                if (*x->p == '?')
                        return idl_fail(x, "?? is not a type");
        }
        if (strncmp(x->p, "[]", 2) == 0) {
                x->p += 2;
                return idl_type(x);
        }
        if (strncmp(x->p, "[string]", 8) == 0) {
                x->p += 8;
                return idl_type(x);
        }
        if (*x->p == '(')
                return idl_struct_or_enum(x, false);
        if (idl_word(x, w, sizeof(w)) == 0)
                return idl_fail(x, "type expected");
        if (streq(w, "bool") || streq(w, "int") || streq(w, "float") || streq(w, "string") || streq(w, "object"))
                return true;
        if (!varlink_member_name_valid(w))
                return idl_fail(x, "bad type name");
        assert_true(x->n_refs < ELEMENTSOF(x->refs));
        strcpy(x->refs[x->n_refs++], w);
        return true;
}

static bool idl_struct_or_enum(Idl *x, bool fields_need_docs) {
        char w[64], seen[32][64];
        size_t n = 0;
        int is_struct = -1;

        if (*x->p != '(')
                return idl_fail(x, "( expected");
        x->p++;
        idl_skip(x);
        if (*x->p == ')') {
                x->p++;
                return true;
        }
        for (;;) {
                if (x->documented)
                        return idl_fail(x, "a comment between fields (systemd 255/256 cannot parse it)");
                if (idl_word(x, w, sizeof(w)) == 0 || !idl_field_name_valid(w))
                        return idl_fail(x, "bad field name");
                if (fields_need_docs && x->require_docs && !idl_field_documented(x, w))
                        return idl_fail(x, "undocumented field");
                for (size_t i = 0; i < n; i++)
                        if (streq(seen[i], w))
                                return idl_fail(x, "field defined twice");
                if (n < ELEMENTSOF(seen))
                        strcpy(seen[n++], w);
                idl_skip(x);
                if (is_struct < 0)
                        is_struct = *x->p == ':';
                if (is_struct) {
                        if (*x->p != ':')
                                return idl_fail(x, ": expected");
                        x->p++;
                        idl_skip(x);
                        if (!idl_type(x))
                                return false;
                        /* The grammar has no whitespace between a type and its comma. */
                        if (*x->p == ',') {
                                x->p++;
                                idl_skip(x);
                                continue;
                        }
                } else if (*x->p == ',') {
                        x->p++;
                        idl_skip(x);
                        continue;
                }
                idl_skip(x);
                if (*x->p != ')')
                        return idl_fail(x, ") expected");
                x->p++;
                return true;
        }
}

static bool idl_name(Idl *x, bool member) {
        char w[64];

        idl_skip(x);
        idl_word(x, w, sizeof(w));
        if (!member)
                return varlink_interface_name_valid(w) || idl_fail(x, "bad interface name");
        if (!varlink_member_name_valid(w))
                return idl_fail(x, "bad member name");
        for (size_t i = 0; i < x->n_names; i++)
                if (streq(x->names[i], w))
                        return idl_fail(x, "member defined twice");
        assert_true(x->n_names < ELEMENTSOF(x->names));
        strcpy(x->names[x->n_names++], w);
        return true;
}

/* After a declaration: spaces, then a newline, a comment or the end. */
static bool idl_eol(Idl *x) {
        while (*x->p == ' ' || *x->p == '\t' || *x->p == '\r')
                x->p++;
        return *x->p == '\n' || *x->p == '#' || *x->p == 0 || idl_fail(x, "newline expected");
}

static const char *idl_check(const char *text, bool require_docs) {
        Idl x = { .p = text, .require_docs = require_docs };
        char w[64];

        idl_skip(&x);
        if (require_docs && !x.documented)
                return "undocumented interface";
        idl_word(&x, w, sizeof(w));
        if (!streq(w, "interface"))
                return "interface expected first";
        if (!idl_name(&x, false) || !idl_eol(&x))
                return x.error;
        for (;;) {
                idl_skip(&x);
                if (*x.p == 0)
                        break;
                if (require_docs && !x.documented)
                        return "undocumented declaration";
                const char *doc_start = x.doc_start, *doc_end = x.doc_end;
                idl_word(&x, w, sizeof(w));
                if (streq(w, "type")) {
                        if (!idl_name(&x, true))
                                return x.error;
                        idl_skip(&x);
                        x.doc_start = doc_start, x.doc_end = doc_end;
                        if (!idl_struct_or_enum(&x, true))
                                return x.error;
                } else if (streq(w, "method")) {
                        if (!idl_name(&x, true))
                                return x.error;
                        idl_skip(&x);
                        x.doc_start = doc_start, x.doc_end = doc_end;
                        if (!idl_struct_or_enum(&x, true))
                                return x.error;
                        idl_skip(&x);
                        if (strncmp(x.p, "->", 2) != 0)
                                return "-> expected";
                        x.p += 2;
                        idl_skip(&x);
                        x.doc_start = doc_start, x.doc_end = doc_end;
                        if (!idl_struct_or_enum(&x, true))
                                return x.error;
                } else if (streq(w, "error")) {
                        if (!idl_name(&x, true))
                                return x.error;
                        idl_skip(&x);
                        x.doc_start = doc_start, x.doc_end = doc_end;
                        if (!idl_struct_or_enum(&x, true))
                                return x.error;
                } else
                        return "type, method or error expected";
                if (!idl_eol(&x))
                        return x.error;
        }
        for (size_t i = 0; i < x.n_refs; i++) {
                bool found = false;
                for (size_t j = 0; j < x.n_names; j++)
                        found = found || streq(x.refs[i], x.names[j]);
                if (!found)
                        return "undefined type";
        }
        return NULL;
}

static void test_interface_definition_follows_grammar_and_is_documented(void **state) {
        const char *error = idl_check(varlink_interface_io_slotbroker, true);
        if (error)
                fail_msg("io.slotbroker.varlink: %s", error);
}

static void test_service_interface_follows_grammar(void **state) {
        const char *error = idl_check(varlink_interface_org_varlink_service, false);
        if (error)
                fail_msg("org.varlink.service: %s", error);
        assert_null(strstr(varlink_interface_org_varlink_service, "string[]"));
}

static void test_idl_checker_refuses_broken_definitions(void **state) {
        static const char *const bad[] = {
                "",
                "method Foo() -> ()\n",
                "interface io\n",
                "interface io.x method Foo() -> ()\n",
                "interface io.x\nmethod foo() -> ()\n",
                "interface io.x\nmethod Foo(a: int,) -> ()\n",
                "interface io.x\nmethod Foo(a: int ,b: int) -> ()\n",
                "interface io.x\nmethod Foo(a: Bar) -> ()\n",
                "interface io.x\nmethod Foo(a: ??int) -> ()\n",
                "interface io.x\nmethod Foo(a: int)\n",
                "interface io.x\nmethod Foo() -> () method Bar() -> ()\n",
                "interface io.x\nmethod Foo() -> ()\nmethod Foo() -> ()\n",
                "interface io.x\nmethod Foo(a: int, a: int) -> ()\n",
                "interface io.x\nmethod Foo(_a: int) -> ()\n",
                "interface io.x\nmethod Foo(a: string[]) -> ()\n",
                "interface io.x\nfunction Foo() -> ()\n",
        };
        for (size_t i = 0; i < ELEMENTSOF(bad); i++)
                if (!idl_check(bad[i], false))
                        fail_msg("accepted: %s", bad[i]);
        assert_null(idl_check("interface io.x\ntype T (a: ?[]int, b: [string](x, y), c: ?[string]object)\n"
                              "method Foo(t: T) -> ()\n", false));
        assert_non_null(idl_check("interface io.x\nmethod Foo(a: int) -> ()\n", true));
        assert_null(idl_check("# d\ninterface io.x\n# d\n#   a: the a\nmethod Foo(\na: int\n) -> ()\n", true));
        assert_non_null(idl_check("# d\ninterface io.x\n# d\nmethod Foo(\n# d\na: int\n) -> ()\n", true));
        assert_non_null(idl_check("# d\ninterface io.x\n# d\n\nmethod Foo() -> ()\n", true));
}

static void test_interface_defines_every_method_and_error(void **state) {
        static const char *const declarations[] = {
                "interface io.slotbroker\n",
                "\nmethod Acquire(\n", "\nmethod Release(\n", "\nmethod Status() -> (\n", "\nmethod History(\n",
                "\nmethod Metrics() -> (\n", "\nmethod Reload() -> ()\n", "\nmethod Drain(\n", "\nmethod Cancel(\n",
                "\nerror Busy (\n", "\nerror QueueFull (\n", "\nerror QueueTimeout (\n", "\nerror QueueShed (\n",
                "\nerror Unavailable (\n", "\nerror NoSuchLane (\n", "\nerror PermissionDenied (\n",
                "\nerror NoSuchPool (\n", "\nerror NoSuchLease (\n", "\nerror ReloadFailed (\n", "\nerror ProtocolError (\n",
                "\ntype Lease (\n", "\ntype PoolStatus (\n", "\ntype Holder (\n", "\ntype Waiter (\n",
                "\ntype HistoryEvent (\n",
        };
        for (size_t i = 0; i < ELEMENTSOF(declarations); i++)
                if (!strstr(varlink_interface_io_slotbroker, declarations[i]))
                        fail_msg("missing: %s", declarations[i]);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_interface_name_follows_grammar),
                cmocka_unit_test(test_member_name_follows_grammar),
                cmocka_unit_test(test_method_split_finds_interface_and_member),
                cmocka_unit_test(test_method_split_refuses_bad_names),
                cmocka_unit_test(test_method_in_interface_matches_whole_interface),
                cmocka_unit_test(test_call_parse_reads_method_parameters_and_flags),
                cmocka_unit_test(test_call_parse_reads_oneway_and_upgrade),
                cmocka_unit_test(test_call_parse_adds_empty_parameters),
                cmocka_unit_test(test_call_parse_treats_null_flags_as_false),
                cmocka_unit_test(test_call_parse_refuses_missing_method),
                cmocka_unit_test(test_call_parse_refuses_bad_method_names),
                cmocka_unit_test(test_call_parse_refuses_more_with_oneway),
                cmocka_unit_test(test_call_parse_refuses_wrong_types_of_every_field),
                cmocka_unit_test(test_call_parse_refuses_unknown_key),
                cmocka_unit_test(test_call_parse_ignores_vendor_extension),
                cmocka_unit_test(test_call_parse_refuses_non_object),
                cmocka_unit_test(test_reply_parse_reads_parameters_and_continues),
                cmocka_unit_test(test_reply_parse_reads_error),
                cmocka_unit_test(test_reply_parse_takes_empty_object_as_empty_reply),
                cmocka_unit_test(test_reply_parse_refuses_continues_on_error),
                cmocka_unit_test(test_reply_parse_refuses_wrong_types_of_every_field),
                cmocka_unit_test(test_call_format_is_compact_json_with_nul),
                cmocka_unit_test(test_call_format_writes_oneway_and_upgrade),
                cmocka_unit_test(test_call_new_refuses_more_with_oneway_and_bad_names),
                cmocka_unit_test(test_reply_format_writes_continues_only_when_asked),
                cmocka_unit_test(test_error_format_writes_error_and_parameters),
                cmocka_unit_test(test_stream_call_and_reply_write_what_the_formatters_write),
                cmocka_unit_test(test_call_message_parse_is_the_tree_parse),
                cmocka_unit_test(test_reply_message_parse_is_the_tree_parse),
                cmocka_unit_test(test_input_next_call_takes_every_message),
                cmocka_unit_test(test_format_escapes_nul_inside_strings),
                cmocka_unit_test(test_input_yields_message_split_at_every_offset),
                cmocka_unit_test(test_input_yields_message_fed_byte_by_byte),
                cmocka_unit_test(test_input_yields_many_messages_from_one_chunk),
                cmocka_unit_test(test_input_accepts_message_of_exactly_max),
                cmocka_unit_test(test_input_refuses_oversize_without_nul),
                cmocka_unit_test(test_input_refuses_oversize_with_nul),
                cmocka_unit_test(test_input_default_cap_is_64k),
                cmocka_unit_test(test_input_drops_malformed_json_and_continues),
                cmocka_unit_test(test_input_refuses_non_object),
                cmocka_unit_test(test_input_refuses_empty_message),
                cmocka_unit_test(test_input_gives_memory_back_when_empty),
                cmocka_unit_test(test_input_shrinks_after_a_large_message),
                cmocka_unit_test(test_output_refuses_past_cap),
                cmocka_unit_test(test_output_json_past_cap_leaves_queue_as_it_was),
                cmocka_unit_test(test_output_shared_bytes_are_sent_then_released),
                cmocka_unit_test(test_output_refused_message_frees_its_chunks),
                cmocka_unit_test(test_output_spans_chunks_for_large_messages),
                cmocka_unit_test(test_output_message_in_parts),
                cmocka_unit_test(test_stream_round_trip_over_socketpair),
                cmocka_unit_test(test_stream_keeps_partial_writes_for_a_slow_reader),
                cmocka_unit_test(test_stream_read_returns_eagain_when_nothing_is_there),
                cmocka_unit_test(test_stream_read_does_not_block_on_blocking_socket),
                cmocka_unit_test(test_stream_read_returns_zero_at_eof),
                cmocka_unit_test(test_stream_eof_inside_message_leaves_pending_input),
                cmocka_unit_test(test_stream_flush_to_closed_peer_fails_without_sigpipe),
                cmocka_unit_test(test_stream_read_refuses_when_messages_are_not_taken),
                cmocka_unit_test(test_stream_refuses_oversize_message_from_socket),
                cmocka_unit_test(test_fds_arrive_with_their_message),
                cmocka_unit_test(test_fds_arrive_with_their_message_across_short_reads),
                cmocka_unit_test(test_fds_of_a_message_taken_without_them_are_closed),
                cmocka_unit_test(test_fds_of_a_malformed_message_are_closed),
                cmocka_unit_test(test_fds_beyond_the_cap_of_one_read_are_refused_and_closed),
                cmocka_unit_test(test_fds_waiting_in_the_input_are_capped),
                cmocka_unit_test(test_stream_not_accepting_fds_leaves_none_open),
                cmocka_unit_test(test_input_fds_belong_to_the_message_of_the_last_byte_fed),
                cmocka_unit_test(test_output_sends_a_message_with_fds_in_a_sendmsg_of_its_own),
                cmocka_unit_test(test_output_done_closes_fds_never_sent),
                cmocka_unit_test(test_embedded_interface_equals_file),
                cmocka_unit_test(test_interface_definition_follows_grammar_and_is_documented),
                cmocka_unit_test(test_service_interface_follows_grammar),
                cmocka_unit_test(test_idl_checker_refuses_broken_definitions),
                cmocka_unit_test(test_interface_defines_every_method_and_error),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
