/* SPDX-License-Identifier: MIT */
/* varlink-tree.c — see varlink-tree.h. */
#include <errno.h>
#include <string.h>

#include "macro.h"
#include "varlink-tree.h"

static bool json_is_bool_or_null(const json_t *v) {
        return json_is_boolean(v) || json_is_null(v);
}

/* A string that is a qualified name: no NUL inside (json strings may hold \u0000), valid grammar. */
static bool json_is_qualified_name(const json_t *v) {
        return json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v) &&
                varlink_qualified_name_valid(json_string_value(v));
}

/* Vendor extensions are keys in reverse-domain notation; anything else unknown is a broken message. */
static bool key_is_extension(const char *key) {
        return strchr(key, '.');
}

/* Makes "parameters" an object: adds {} when it is absent or null. */
static int parameters_normalize(json_t *msg, json_t **ret) {
        json_t *p = json_object_get(msg, "parameters");
        if (json_is_object(p)) {
                *ret = p;
                return 0;
        }
        p = json_object();
        if (!p)
                return -ENOMEM;
        if (json_object_set_new(msg, "parameters", p) < 0)
                return -ENOMEM;
        *ret = p;
        return 0;
}

int tree_call_parse(json_t *msg, VarlinkCall *ret) {
        const char *key, *method = NULL;
        VarlinkCallFlags flags = 0;
        json_t *v, *parameters;
        int r;

        assert_return(ret, -EINVAL);

        if (!json_is_object(msg))
                return -EBADMSG;

        json_object_foreach(msg, key, v) {
                if (streq(key, "method")) {
                        if (!json_is_qualified_name(v))
                                return -EBADMSG;
                        method = json_string_value(v);
                } else if (streq(key, "parameters")) {
                        if (!json_is_object(v) && !json_is_null(v))
                                return -EBADMSG;
                } else if (streq(key, "more") || streq(key, "oneway") || streq(key, "upgrade")) {
                        if (!json_is_bool_or_null(v))
                                return -EBADMSG;
                        if (json_is_true(v))
                                flags |= key[0] == 'm' ? VARLINK_CALL_MORE :
                                         key[0] == 'o' ? VARLINK_CALL_ONEWAY : VARLINK_CALL_UPGRADE;
                } else if (!key_is_extension(key))
                        return -EBADMSG;
        }
        if (!method)
                return -EBADMSG;
        /* A oneway call has no reply at all, a more call several: together they mean nothing. */
        if ((flags & VARLINK_CALL_MORE) && (flags & VARLINK_CALL_ONEWAY))
                return -EBADMSG;

        r = parameters_normalize(msg, &parameters);
        if (r < 0)
                return r;

        *ret = (VarlinkCall) {
                .method = method,
                .parameters = parameters,
                .flags = flags,
        };
        return 0;
}

int tree_reply_parse(json_t *msg, VarlinkReply *ret) {
        const char *key, *error = NULL;
        VarlinkReplyFlags flags = 0;
        json_t *v, *parameters;
        int r;

        assert_return(ret, -EINVAL);

        if (!json_is_object(msg))
                return -EBADMSG;

        json_object_foreach(msg, key, v) {
                if (streq(key, "error")) {
                        if (json_is_null(v))
                                continue;
                        if (!json_is_qualified_name(v))
                                return -EBADMSG;
                        error = json_string_value(v);
                } else if (streq(key, "parameters")) {
                        if (!json_is_object(v) && !json_is_null(v))
                                return -EBADMSG;
                } else if (streq(key, "continues")) {
                        if (!json_is_bool_or_null(v))
                                return -EBADMSG;
                        if (json_is_true(v))
                                flags |= VARLINK_REPLY_CONTINUES;
                } else if (!key_is_extension(key))
                        return -EBADMSG;
        }
        /* An error ends its call. */
        if (error && (flags & VARLINK_REPLY_CONTINUES))
                return -EBADMSG;

        r = parameters_normalize(msg, &parameters);
        if (r < 0)
                return r;

        *ret = (VarlinkReply) {
                .error = error,
                .parameters = parameters,
                .flags = flags,
        };
        return 0;
}
