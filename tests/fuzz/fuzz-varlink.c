/* SPDX-License-Identifier: MIT */
/* fuzz-varlink.c — the Varlink input buffer fed in small chunks, every message read as a call and as a
 * reply, its parameters dispatched, and replies built back. Whatever is accepted must survive a round
 * trip through the wire format unchanged.
 *
 * Input layout: byte 0 selects the message cap (odd: 256 bytes, so small inputs reach -EMSGSIZE; even:
 * the daemon's 64 KiB); bytes 1..3 are the chunk sizes used in turn (1..64); the rest is the stream. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "varlink-tree.h"
#include "varlink.h"
#include "fuzz.h"

/* Wire bytes back into a message: must give the same JSON. */
static void check_round_trip(const char *wire, size_t size, const json_t *expected) {
        VarlinkInput in;
        json_t *back = NULL;

        check(size > 0 && wire[size - 1] == 0);
        check(memchr(wire, 0, size) == wire + size - 1);
        /* Reformatting can lengthen a message (1e5 comes back as 100000.0): no small cap here. */
        varlink_input_init(&in, VARLINK_REPLY_MAX_DEFAULT);
        check(varlink_input_feed(&in, wire, size) == 0);
        check(varlink_input_next(&in, &back) == 1);
        check(json_equal(back, expected));
        check(varlink_input_pending(&in) == 0);
        json_decref(back);
        varlink_input_done(&in);
}

/* The shape of an Acquire call, with every kind of field. */
static void dispatch_parameters(json_t *parameters, VarlinkOutput *out) {
        const char *lane = NULL, *job = NULL, *bad = NULL;
        bool wait = true;
        int64_t queue_wait_ms = 0;
        uint64_t pid = 0;
        unsigned slots = 1;
        json_t *extra = NULL, *list = NULL;
        char **members = NULL;
        const JsonField table[] = {
                { "lane", JSON_FIELD_STRING, JSON_MANDATORY, &lane, .max_length = 255 },
                { "slots", JSON_FIELD_UNSIGNED, 0, &slots, .min = 1, .max = 1024 },
                { "wait", JSON_FIELD_BOOL, 0, &wait },
                { "queueWaitMs", JSON_FIELD_INT64, 0, &queue_wait_ms, .min = 1, .max = INT32_MAX },
                { "job", JSON_FIELD_STRING, 0, &job },
                { "pid", JSON_FIELD_UINT64, 0, &pid },
                { "extra", JSON_FIELD_OBJECT, 0, &extra },
                { "list", JSON_FIELD_ARRAY, 0, &list, .max_length = 8 },
                { "members", JSON_FIELD_STRV, 0, &members, .max_length = 8 },
                {}
        };
        _cleanup_free_ char *wire = NULL;
        size_t n = 0;
        int r;

        r = json_dispatch(parameters, table, 0, &bad);
        if (r == -EINVAL) {
                _cleanup_(json_decrefp) json_t *p = NULL;

                check(bad);
                check(!lane && !members && slots == 1 && wait && queue_wait_ms == 0);
                if (json_build(&p, "{s:s}", "parameter", bad) < 0)
                        return;
                r = varlink_error_format(VARLINK_ERROR_INVALID_PARAMETER, p, &wire, &n);
                check(r == 0 || r == -ENOMEM);
                if (r == 0) {
                        _cleanup_(json_decrefp) json_t *e = NULL;
                        check(varlink_error_new(VARLINK_ERROR_INVALID_PARAMETER, p, &e) == 0);
                        check_round_trip(wire, n, e);
                }
                return;
        }
        if (r < 0)
                return;

        check(lane && strlen(lane) <= 255);
        check(slots >= 1 && slots <= 1024);
        check(queue_wait_ms == 0 || (queue_wait_ms >= 1 && queue_wait_ms <= INT32_MAX));
        for (char **m = members; m && *m; m++)
                check(strlen(*m) <= JSON_STRING_MAX_DEFAULT);
        json_strv_free(members);

        /* Echo them as a reply, into a small capped queue. */
        r = varlink_reply_format(parameters, VARLINK_REPLY_CONTINUES, &wire, &n);
        check(r == 0 || r == -ENOMEM);
        if (r == 0) {
                _cleanup_(json_decrefp) json_t *reply = NULL;
                check(varlink_reply_new(parameters, VARLINK_REPLY_CONTINUES, &reply) == 0);
                check_round_trip(wire, n, reply);
                r = varlink_output_enqueue_json(out, reply);
                check(r == 0 || r == -ENOBUFS || r == -ENOMEM);
        }
}

static void process_call(json_t *msg, VarlinkOutput *out) {
        VarlinkCall call;
        size_t interface_len;
        const char *member;
        _cleanup_free_ char *wire = NULL;
        size_t n = 0;
        int r;

        r = tree_call_parse(msg, &call);
        if (r < 0) {
                check(r == -EBADMSG || r == -ENOMEM);
                return;
        }
        check(json_is_object(call.parameters));
        check(!((call.flags & VARLINK_CALL_MORE) && (call.flags & VARLINK_CALL_ONEWAY)));
        check(varlink_method_split(call.method, &interface_len, &member) == 0);
        check(varlink_interface_name_valid(call.method) == false);
        check(varlink_member_name_valid(member));

        /* The call, rebuilt, parses back to the same call. */
        r = varlink_call_format(call.method, call.parameters, call.flags, &wire, &n);
        check(r == 0 || r == -ENOMEM);
        if (r == 0) {
                _cleanup_(json_decrefp) json_t *again = NULL;
                VarlinkCall call2;
                check(varlink_call_new(call.method, call.parameters, call.flags, &again) == 0);
                check_round_trip(wire, n, again);
                check(tree_call_parse(again, &call2) == 0);
                check(streq(call2.method, call.method) && call2.flags == call.flags);
                check(json_equal(call2.parameters, call.parameters));
        }

        dispatch_parameters(call.parameters, out);
}

static void process_reply(json_t *msg) {
        VarlinkReply reply;
        _cleanup_free_ char *wire = NULL;
        _cleanup_(json_decrefp) json_t *again = NULL;
        size_t n = 0;
        int r;

        r = tree_reply_parse(msg, &reply);
        if (r < 0) {
                check(r == -EBADMSG || r == -ENOMEM);
                return;
        }
        check(json_is_object(reply.parameters));
        if (reply.error) {
                check(!(reply.flags & VARLINK_REPLY_CONTINUES));
                check(varlink_qualified_name_valid(reply.error));
                r = varlink_error_format(reply.error, reply.parameters, &wire, &n);
                if (r == 0)
                        check(varlink_error_new(reply.error, reply.parameters, &again) == 0);
        } else {
                r = varlink_reply_format(reply.parameters, reply.flags, &wire, &n);
                if (r == 0)
                        check(varlink_reply_new(reply.parameters, reply.flags, &again) == 0);
        }
        check(r == 0 || r == -ENOMEM);
        if (r == 0)
                check_round_trip(wire, n, again);
}

/* The call and the reply read straight from the bytes (as brokerd reads a call, and libbroker's client a
 * reply) are the ones read from the tree: the same name, flags and parameters; a message the tree's parse
 * refuses is -EBADMSG there too, and JSON that is not a call (or not a reply) -EPROTO. r and msg:
 * varlink_input_next()'s; rc and call, rr and reply: the straight readers'. */
static void check_read_straight(int r, const json_t *msg, int rc, const VarlinkCallMessage *call, int rr,
                                const VarlinkReplyMessage *reply) {
        if (r == -ENOMEM || rc == -ENOMEM || rr == -ENOMEM)
                return;
        if (r <= 0) {
                check(rc == r && rr == r);
                return;
        }
        _cleanup_(json_decrefp) json_t *call_tree = json_deep_copy(msg), *reply_tree = json_deep_copy(msg);
        VarlinkCall c;
        VarlinkReply p;
        if (!call_tree || !reply_tree)
                return;
        int kc = tree_call_parse(call_tree, &c), kr = tree_reply_parse(reply_tree, &p);
        if (kc == -ENOMEM || kr == -ENOMEM)
                return;
        check(kc < 0 ? rc == -EPROTO : rc == 1);
        check(kr < 0 ? rr == -EPROTO : rr == 1);
        if (kc == 0) {
                check(streq(call->method, c.method) && call->flags == c.flags);
                check(json_equal(call->parameters, c.parameters));
        }
        if (kr == 0) {
                check(streq_ptr(reply->error, p.error) && reply->flags == p.flags);
                check(json_equal(reply->parameters, p.parameters));
        }
}

static void process(json_t *msg, VarlinkOutput *out) {
        /* Parsing a call adds "parameters" to the message: the reply parser gets its own copy. */
        _cleanup_(json_decrefp) json_t *copy = json_deep_copy(msg);
        if (!copy)
                return;
        process_call(msg, out);
        process_reply(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        uint8_t header[4] = {};
        VarlinkInput in;
        VarlinkOutput out;
        size_t h = MIN(size, sizeof(header)), turn = 0;

        memcpy(header, data, h);
        data += h;
        size -= h;

        VarlinkInput in2, in3; /* the same stream, read as calls and as replies straight from the bytes */
        varlink_input_init(&in, header[0] & 1 ? 256 : 0);
        varlink_input_init(&in2, header[0] & 1 ? 256 : 0);
        varlink_input_init(&in3, header[0] & 1 ? 256 : 0);
        varlink_output_init(&out, 2048); /* small, so that a few echoed calls reach -ENOBUFS */

        while (size > 0) {
                size_t chunk = 1 + (size_t) header[1 + turn++ % 3] % 64;
                chunk = MIN(chunk, size);

                check(varlink_input_feed(&in, data, chunk) == 0);
                check(varlink_input_feed(&in2, data, chunk) == 0);
                check(varlink_input_feed(&in3, data, chunk) == 0);
                data += chunk;
                size -= chunk;

                for (;;) {
                        _cleanup_(json_decrefp) json_t *m = NULL;
                        size_t before = varlink_input_pending(&in);
                        int r = varlink_input_next(&in, &m);
                        _cleanup_(varlink_call_message_done) VarlinkCallMessage direct = VARLINK_CALL_MESSAGE_INIT;
                        int r2 = varlink_input_next_call_with_fds(&in2, &direct, NULL);
                        _cleanup_(varlink_reply_message_done) VarlinkReplyMessage direct_reply = VARLINK_REPLY_MESSAGE_INIT;
                        int r3 = varlink_input_next_reply(&in3, &direct_reply);
                        check_read_straight(r, m, r2, &direct, r3, &direct_reply);
                        if (r != -ENOMEM && r2 != -ENOMEM && r3 != -ENOMEM) {
                                check(varlink_input_pending(&in2) == varlink_input_pending(&in));
                                check(varlink_input_pending(&in3) == varlink_input_pending(&in));
                        }
                        if (r == 0)
                                break;
                        if (r == -EMSGSIZE)
                                goto finish; /* the daemon closes the connection here */
                        check(r == 1 || r == -EBADMSG);
                        check(varlink_input_pending(&in) < before); /* every message is taken */
                        if (r == 1) {
                                check(json_is_object(m));
                                process(m, &out);
                        }
                }
        }

finish:
        varlink_output_done(&out);
        varlink_input_done(&in);
        varlink_input_done(&in2);
        varlink_input_done(&in3);
        return 0;
}
