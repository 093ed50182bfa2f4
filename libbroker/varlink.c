/* SPDX-License-Identifier: MIT */
/* varlink.c — Varlink framing: names, calls and replies, the input buffer, the output queue, the stream. */
#include <fcntl.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "varlink.h"

/* The standard service interface as varlink.org's reference implementations ship it, with the two
 * errors (PermissionDenied, ExpectedMore) that systemd and python-varlink added. */
const char varlink_interface_org_varlink_service[] =
        "# The Varlink Service Interface is provided by every varlink service. It\n"
        "# describes the service and the interfaces it implements.\n"
        "interface org.varlink.service\n"
        "\n"
        "# Get a list of all the interfaces a service provides and information\n"
        "# about the implementation.\n"
        "method GetInfo() -> (\n"
        "  vendor: string,\n"
        "  product: string,\n"
        "  version: string,\n"
        "  url: string,\n"
        "  interfaces: []string\n"
        ")\n"
        "\n"
        "# Get the description of an interface that is implemented by this service.\n"
        "method GetInterfaceDescription(interface: string) -> (description: string)\n"
        "\n"
        "# The requested interface was not found.\n"
        "error InterfaceNotFound (interface: string)\n"
        "\n"
        "# The requested method was not found\n"
        "error MethodNotFound (method: string)\n"
        "\n"
        "# The interface defines the requested method, but the service does not\n"
        "# implement it.\n"
        "error MethodNotImplemented (method: string)\n"
        "\n"
        "# One of the passed parameters is invalid.\n"
        "error InvalidParameter (parameter: string)\n"
        "\n"
        "# Client is denied access\n"
        "error PermissionDenied ()\n"
        "\n"
        "# Method is expected to be called with 'more' set to true, but wasn't\n"
        "error ExpectedMore ()\n";

/* ---- names ---- */

static bool char_lower_alnum(char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

static bool char_alnum(char c) {
        return char_lower_alnum(c) || (c >= 'A' && c <= 'Z');
}

/* [a-z]([-]*[a-z0-9])*(\.[a-z0-9]([-]*[a-z0-9])*)+ over s[0..n) */
static bool interface_name_valid_n(const char *s, size_t n) {
        size_t segments = 0;
        size_t i = 0;

        if (n == 0 || !(s[0] >= 'a' && s[0] <= 'z'))
                return false;
        while (i < n) {
                /* A segment starts with a letter or digit and ends with one; dashes only inside. */
                if (!char_lower_alnum(s[i]))
                        return false;
                while (i < n && s[i] != '.') {
                        if (!char_lower_alnum(s[i]) && s[i] != '-')
                                return false;
                        i++;
                }
                if (s[i - 1] == '-')
                        return false;
                segments++;
                if (i < n) {
                        i++; /* the dot */
                        if (i == n)
                                return false;
                }
        }
        return segments >= 2;
}

bool varlink_interface_name_valid(const char *s) {
        return s && interface_name_valid_n(s, strlen(s));
}

bool varlink_member_name_valid(const char *s) {
        if (!s || !(s[0] >= 'A' && s[0] <= 'Z'))
                return false;
        for (const char *p = s + 1; *p; p++)
                if (!char_alnum(*p))
                        return false;
        return true;
}

int varlink_method_split(const char *method, size_t *ret_interface_len, const char **ret_member) {
        assert_return(method, -EINVAL);

        const char *dot = strrchr(method, '.');
        if (!dot || !varlink_member_name_valid(dot + 1) || !interface_name_valid_n(method, dot - method))
                return -EINVAL;
        if (ret_interface_len)
                *ret_interface_len = dot - method;
        if (ret_member)
                *ret_member = dot + 1;
        return 0;
}

bool varlink_qualified_name_valid(const char *s) {
        return s && varlink_method_split(s, NULL, NULL) >= 0;
}

bool varlink_method_in_interface(const char *method, const char *interface) {
        if (!method || !interface)
                return false;
        size_t n = strlen(interface);
        return strncmp(method, interface, n) == 0 && method[n] == '.' && !strchr(method + n + 1, '.');
}

/* ---- calls and replies ---- */

static bool json_is_bool_or_null(const json_t *v) {
        return json_is_boolean(v) || json_is_null(v);
}

/* What a message's envelope holds besides its parameters: a name ("method" of a call, "error" of a reply)
 * and flags (booleans, bit i for flags[i]). */
typedef struct EnvelopeShape {
        const char *name;
        bool name_mandatory;
        bool name_nullable;             /* null: no name (a reply without error) */
        const char *flags[3];
        unsigned flags_exclusive;       /* not all of these together */
        unsigned flags_without_name;    /* none of these with a name */
} EnvelopeShape;

/* A oneway call has no reply at all, a more call several: together they mean nothing. An error ends its
 * call. */
static const EnvelopeShape call_shape = {
        .name = "method", .name_mandatory = true,
        .flags = { "more", "oneway", "upgrade" }, .flags_exclusive = VARLINK_CALL_MORE | VARLINK_CALL_ONEWAY,
};
static const EnvelopeShape reply_shape = {
        .name = "error", .name_nullable = true,
        .flags = { "continues" }, .flags_without_name = VARLINK_REPLY_CONTINUES,
};

_Static_assert(VARLINK_CALL_MORE == 1 << 0 && VARLINK_CALL_ONEWAY == 1 << 1 && VARLINK_CALL_UPGRADE == 1 << 2 &&
                       VARLINK_REPLY_CONTINUES == 1 << 0,
               "flags in the shapes' order");

typedef struct Envelope {
        char *name;             /* NULL: absent (or null) */
        json_t *parameters;     /* NULL: absent (or null) */
        unsigned flags;
} Envelope;

static void envelope_done(Envelope *e) {
        free(e->name);
        json_decref(e->parameters);
        *e = (Envelope) {};
}

/* The envelope's keys the shape knows, each allowed once: 1 the name, 2 "parameters", 4 << i flags[i]. */
static unsigned envelope_key(const EnvelopeShape *shape, const char *key, size_t n) {
        if (strlen(shape->name) == n && memcmp(shape->name, key, n) == 0)
                return 1;
        if (n == 10 && memcmp("parameters", key, n) == 0)
                return 2;
        for (size_t i = 0; i < ELEMENTSOF(shape->flags) && shape->flags[i]; i++)
                if (strlen(shape->flags[i]) == n && memcmp(shape->flags[i], key, n) == 0)
                        return 4u << i;
        return 0;
}

/* One member of an envelope: its value read and judged. *not_one set when the JSON is fine but the message
 * is not of the shape (the rest is still read: malformed JSON further on is -EBADMSG, as the tree's parse
 * says). */
static int envelope_member(JsonMembers *m, const EnvelopeShape *shape, const char *key, size_t key_size,
                           unsigned *seen, json_t **others, Envelope *e, bool *not_one) {
        unsigned k = envelope_key(shape, key, key_size);
        _cleanup_(json_decrefp) json_t *v = NULL;
        int r;

        if (k != 0) {
                if (*seen & k)
                        return -EBADMSG; /* a duplicate: json_parse_object() refuses it */
                *seen |= k;
        }
        if (k == 1) {
                const char *s;
                size_t n;
                _cleanup_free_ char *allocated = NULL;
                r = json_members_string(m, &s, &n, &allocated);
                if (r < 0)
                        return r;
                if (r > 0) {
                        /* A qualified name holds no NUL (json strings may: \u0000). */
                        if (memchr(s, 0, n)) {
                                *not_one = true;
                                return 0;
                        }
                        e->name = strndup(s, n);
                        if (!e->name)
                                return -ENOMEM;
                        if (!varlink_qualified_name_valid(e->name))
                                *not_one = true;
                        return 0;
                }
        }
        r = json_members_value(m, &v);
        if (r < 0)
                return r;
        if (k == 1) {
                /* Not a string. */
                if (!(shape->name_nullable && json_is_null(v)))
                        *not_one = true;
        } else if (k == 2) {
                if (json_is_object(v))
                        e->parameters = TAKE_PTR(v);
                else if (!json_is_null(v))
                        *not_one = true;
        } else if (k != 0) {
                if (!json_is_bool_or_null(v))
                        *not_one = true;
                else if (json_is_true(v))
                        e->flags |= k >> 2;
        } else {
                /* Any other key: a vendor extension (dropped), or not of the shape; each once, as in the tree. */
                if (!*others && !(*others = json_object()))
                        return -ENOMEM;
                size_t before = json_object_size(*others);
                if (json_object_setn_new_nocheck(*others, key, key_size, json_null()) < 0)
                        return -ENOMEM;
                if (json_object_size(*others) == before)
                        return -EBADMSG;
                if (!memchr(key, '.', key_size))
                        *not_one = true;
        }
        return 0;
}

/* A message's envelope read member by member, only its parameters built as a tree (an empty object when
 * absent or null). Returns 0; -EBADMSG (malformed JSON); -EPROTO (JSON, but not of the shape); -ENOMEM. */
static int envelope_parse(const void *data, size_t size, const EnvelopeShape *shape, Envelope *ret) {
        _cleanup_(envelope_done) Envelope e = {};
        _cleanup_(json_decrefp) json_t *others = NULL;
        unsigned seen = 0;
        bool not_one = false;
        JsonMembers m;
        int r;

        r = json_members_begin(&m, data, size);
        if (r < 0)
                return r;
        for (;;) {
                const char *key;
                size_t key_size;
                _cleanup_free_ char *key_allocated = NULL;
                r = json_members_next(&m, &key, &key_size, &key_allocated);
                if (r < 0)
                        return r;
                if (r == 0)
                        break;
                r = envelope_member(&m, shape, key, key_size, &seen, &others, &e, &not_one);
                if (r < 0)
                        return r;
        }
        if (not_one || (shape->name_mandatory && !e.name) ||
            (shape->flags_exclusive != 0 && (e.flags & shape->flags_exclusive) == shape->flags_exclusive) ||
            (e.name && (e.flags & shape->flags_without_name)))
                return -EPROTO;
        if (!e.parameters && !(e.parameters = json_object()))
                return -ENOMEM;
        *ret = e;
        e = (Envelope) {};
        return 0;
}

static VarlinkCallMessage call_message_of(Envelope *e) {
        VarlinkCallMessage m = { .method = e->name, .parameters = e->parameters, .flags = e->flags };
        *e = (Envelope) {};
        return m;
}

static VarlinkReplyMessage reply_message_of(Envelope *e) {
        VarlinkReplyMessage m = { .error = e->name, .parameters = e->parameters, .flags = e->flags };
        *e = (Envelope) {};
        return m;
}

int varlink_call_message_parse(const void *data, size_t size, VarlinkCallMessage *ret) {
        Envelope e;

        assert_return(data || size == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        int r = envelope_parse(data, size, &call_shape, &e);
        if (r < 0)
                return r;
        *ret = call_message_of(&e);
        return 0;
}

void varlink_call_message_done(VarlinkCallMessage *m) {
        if (!m)
                return;
        free(m->method);
        json_decref(m->parameters);
        *m = VARLINK_CALL_MESSAGE_INIT;
}

VarlinkCall varlink_call_message_call(const VarlinkCallMessage *m) {
        return (VarlinkCall) { .method = m->method, .parameters = m->parameters, .flags = m->flags };
}

int varlink_reply_message_parse(const void *data, size_t size, VarlinkReplyMessage *ret) {
        Envelope e;

        assert_return(data || size == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        int r = envelope_parse(data, size, &reply_shape, &e);
        if (r < 0)
                return r;
        *ret = reply_message_of(&e);
        return 0;
}

void varlink_reply_message_done(VarlinkReplyMessage *m) {
        if (!m)
                return;
        free(m->error);
        json_decref(m->parameters);
        *m = VARLINK_REPLY_MESSAGE_INIT;
}

VarlinkReply varlink_reply_message_reply(const VarlinkReplyMessage *m) {
        return (VarlinkReply) { .error = m->error, .parameters = m->parameters, .flags = m->flags };
}

/* Sets msg[key] to parameters, or to a new {} when NULL. */
static int set_parameters(json_t *msg, json_t *parameters) {
        json_t *p = parameters ? json_incref(parameters) : json_object();
        if (!p)
                return -ENOMEM;
        return json_object_set_new(msg, "parameters", p) < 0 ? -ENOMEM : 0;
}

static int set_true(json_t *msg, const char *key) {
        return json_object_set_new(msg, key, json_true()) < 0 ? -ENOMEM : 0;
}

int varlink_call_new(const char *method, json_t *parameters, VarlinkCallFlags flags, json_t **ret) {
        int r;

        assert_return(varlink_qualified_name_valid(method), -EINVAL);
        assert_return(!parameters || json_is_object(parameters), -EINVAL);
        assert_return((flags & ~(VARLINK_CALL_MORE | VARLINK_CALL_ONEWAY | VARLINK_CALL_UPGRADE)) == 0, -EINVAL);
        assert_return(!((flags & VARLINK_CALL_MORE) && (flags & VARLINK_CALL_ONEWAY)), -EINVAL);
        assert_return(ret, -EINVAL);

        _cleanup_(json_decrefp) json_t *m = json_object();
        if (!m)
                return -ENOMEM;
        if (json_object_set_new(m, "method", json_string(method)) < 0)
                return -ENOMEM;
        r = set_parameters(m, parameters);
        if (r < 0)
                return r;
        static const struct {
                VarlinkCallFlags flag;
                const char *key;
        } keys[] = {
                { VARLINK_CALL_MORE, "more" },
                { VARLINK_CALL_ONEWAY, "oneway" },
                { VARLINK_CALL_UPGRADE, "upgrade" },
        };
        for (size_t i = 0; i < ELEMENTSOF(keys); i++)
                if (flags & keys[i].flag) {
                        r = set_true(m, keys[i].key);
                        if (r < 0)
                                return r;
                }

        *ret = TAKE_PTR(m);
        return 0;
}

int varlink_reply_new(json_t *parameters, VarlinkReplyFlags flags, json_t **ret) {
        int r;

        assert_return(!parameters || json_is_object(parameters), -EINVAL);
        assert_return((flags & ~VARLINK_REPLY_CONTINUES) == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        _cleanup_(json_decrefp) json_t *m = json_object();
        if (!m)
                return -ENOMEM;
        r = set_parameters(m, parameters);
        if (r < 0)
                return r;
        if (flags & VARLINK_REPLY_CONTINUES) {
                r = set_true(m, "continues");
                if (r < 0)
                        return r;
        }

        *ret = TAKE_PTR(m);
        return 0;
}

int varlink_error_new(const char *error, json_t *parameters, json_t **ret) {
        int r;

        assert_return(varlink_qualified_name_valid(error), -EINVAL);
        assert_return(!parameters || json_is_object(parameters), -EINVAL);
        assert_return(ret, -EINVAL);

        _cleanup_(json_decrefp) json_t *m = json_object();
        if (!m)
                return -ENOMEM;
        if (json_object_set_new(m, "error", json_string(error)) < 0)
                return -ENOMEM;
        r = set_parameters(m, parameters);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(m);
        return 0;
}

int varlink_message_format(const json_t *msg, char **ret, size_t *ret_size) {
        size_t n;
        int r;

        assert_return(json_is_object(msg), -EINVAL);
        assert_return(ret, -EINVAL);

        /* json_format()'s own terminator is the message's NUL: the text cannot hold another one. */
        r = json_format(msg, ret, &n);
        if (r < 0)
                return r;
        if (ret_size)
                *ret_size = n + 1;
        return 0;
}

int varlink_call_format(const char *method, json_t *parameters, VarlinkCallFlags flags, char **ret, size_t *ret_size) {
        _cleanup_(json_decrefp) json_t *m = NULL;
        int r;

        r = varlink_call_new(method, parameters, flags, &m);
        if (r < 0)
                return r;
        return varlink_message_format(m, ret, ret_size);
}

int varlink_reply_format(json_t *parameters, VarlinkReplyFlags flags, char **ret, size_t *ret_size) {
        _cleanup_(json_decrefp) json_t *m = NULL;
        int r;

        r = varlink_reply_new(parameters, flags, &m);
        if (r < 0)
                return r;
        return varlink_message_format(m, ret, ret_size);
}

int varlink_error_format(const char *error, json_t *parameters, char **ret, size_t *ret_size) {
        _cleanup_(json_decrefp) json_t *m = NULL;
        int r;

        r = varlink_error_new(error, parameters, &m);
        if (r < 0)
                return r;
        return varlink_message_format(m, ret, ret_size);
}

/* ---- file descriptors ---- */

static void (*received_fd_closer)(int fd);

void varlink_set_received_fd_closer(void (*close_fn)(int fd)) {
        received_fd_closer = close_fn;
}

/* A received fd, or one of a VarlinkFds (the output's own dups among them: closing those never blocks,
 * and the closer takes them as well). Returns -EBADF. */
static int received_fd_close(int fd) {
        if (fd < 0)
                return -EBADF;
        if (received_fd_closer)
                received_fd_closer(fd);
        else
                safe_close(fd);
        return -EBADF;
}

void varlink_fds_close(VarlinkFds *f) {
        if (!f)
                return;
        for (size_t i = 0; i < f->n; i++)
                f->fds[i] = received_fd_close(f->fds[i]);
        f->n = 0;
}

int varlink_fds_take(VarlinkFds *f, size_t index) {
        assert_return(f, -EINVAL);
        if (index >= f->n || f->fds[index] < 0)
                return -ENXIO;
        return TAKE_FD(f->fds[index]);
}

/* ---- input ---- */

void varlink_input_init(VarlinkInput *in, size_t max_message) {
        *in = (VarlinkInput) {
                .max = max_message > 0 ? max_message : VARLINK_CALL_MAX_DEFAULT,
        };
}

static void input_release(VarlinkInput *in) {
        in->data = mfree(in->data);
        in->offset += in->end;
        in->start = in->scanned = in->end = in->allocated = 0;
}

void varlink_input_done(VarlinkInput *in) {
        input_release(in);
        varlink_fds_close(&in->fds);
}

/* Makes room for size more bytes after end. Moving the partial message to the front costs each byte at
 * most once: it is moved only after the messages before it were taken, and it is taken before the next
 * move. */
static int input_reserve(VarlinkInput *in, size_t size) {
        if (in->start > 0) {
                size_t n = in->end - in->start;
                memmove(in->data, in->data + in->start, n);
                in->offset += in->start;
                in->scanned -= in->start;
                in->end = n;
                in->start = 0;
        }
        if (size > SIZE_MAX / 4 - in->end)
                return -ENOMEM;
        size_t need = MAX(in->end + size, VARLINK_INPUT_MIN);
        if (in->allocated > 4 * need) {
                /* A large message has gone through: do not keep its buffer for the small ones behind it. */
                char *d = realloc(in->data, 2 * need);
                if (d) {
                        in->data = d;
                        in->allocated = 2 * need;
                }
        }
        if (in->allocated - in->end >= size)
                return 0;

        size_t a = MAX(in->end + size, 2 * in->allocated);
        char *d = realloc(in->data, a);
        if (!d)
                return -ENOMEM;
        in->data = d;
        in->allocated = a;
        return 0;
}

int varlink_input_feed(VarlinkInput *in, const void *data, size_t size) {
        int r;

        assert_return(in, -EINVAL);
        assert_return(data || size == 0, -EINVAL);

        if (size == 0)
                return 0;
        r = input_reserve(in, size);
        if (r < 0)
                return r;
        memcpy(in->data + in->end, data, size);
        in->end += size;
        return 0;
}

int varlink_input_feed_fds(VarlinkInput *in, const int *fds, size_t n) {
        assert_return(in, -EINVAL);
        assert_return(fds || n == 0, -EINVAL);

        if (n == 0)
                return 0;
        if (in->end == in->start || n > VARLINK_FDS_MAX - in->fds.n) {
                for (size_t i = 0; i < n; i++)
                        received_fd_close(fds[i]);
                return in->end == in->start ? -EINVAL : -ETOOMANYREFS;
        }
        for (size_t i = 0; i < n; i++) {
                in->fds_at[in->fds.n] = in->offset + in->end - 1;
                in->fds.fds[in->fds.n++] = fds[i];
        }
        return 0;
}

/* Hands the fds that arrived with bytes up to stream position `through` (a message's NUL) to ret, or
 * closes them (ret NULL). They are in the order received, so they are a prefix. */
static void input_take_fds(VarlinkInput *in, uint64_t through, VarlinkFds *ret) {
        size_t k = 0;
        while (k < in->fds.n && in->fds_at[k] <= through)
                k++;
        for (size_t i = 0; i < k; i++)
                if (ret)
                        ret->fds[ret->n++] = in->fds.fds[i];
                else
                        received_fd_close(in->fds.fds[i]);
        memmove(in->fds.fds, in->fds.fds + k, (in->fds.n - k) * sizeof(int));
        memmove(in->fds_at, in->fds_at + k, (in->fds.n - k) * sizeof(uint64_t));
        in->fds.n -= k;
}

int varlink_input_next(VarlinkInput *in, json_t **ret) {
        return varlink_input_next_with_fds(in, ret, NULL);
}

/* The next whole message (NUL-terminated) in the input: 1 and its bytes (without the NUL); 0 when none is
 * whole yet; -EMSGSIZE. Taken by input_take_message(). */
static int input_peek_message(VarlinkInput *in, const char **ret, size_t *ret_size) {
        if (in->start == in->end) {
                /* Idle connections hold no buffer. */
                input_release(in);
                return 0;
        }
        char *nul = memchr(in->data + in->scanned, 0, in->end - in->scanned);
        if (!nul) {
                in->scanned = in->end;
                return in->end - in->start > in->max ? -EMSGSIZE : 0;
        }
        size_t n = nul - (in->data + in->start);
        if (n > in->max)
                return -EMSGSIZE;
        *ret = in->data + in->start;
        *ret_size = n;
        return 1;
}

/* Taken, parsed or not: a broken message must not block the ones behind it. Its fds go with it (to
 * ret_fds, or closed when NULL). */
static void input_take_message(VarlinkInput *in, size_t size, VarlinkFds *ret_fds) {
        uint64_t nul_at = in->offset + (uint64_t) (in->start + size);
        in->start = in->scanned = in->start + size + 1;
        input_take_fds(in, nul_at, ret_fds);
        if (in->start == in->end)
                input_release(in);
}

/* The next message read as the shape says: 1; 0; -EPROTO, -EBADMSG (taken, with its fds); -EMSGSIZE; -ENOMEM. */
static int input_next_envelope(VarlinkInput *in, const EnvelopeShape *shape, Envelope *ret, VarlinkFds *ret_fds) {
        const char *data;
        size_t n;
        int r;

        r = input_peek_message(in, &data, &n);
        if (r <= 0)
                return r;
        r = envelope_parse(data, n, shape, ret);
        if (r == -ENOMEM)
                return r;
        input_take_message(in, n, r < 0 ? NULL : ret_fds);
        return r < 0 ? r : 1;
}

int varlink_input_next_call_with_fds(VarlinkInput *in, VarlinkCallMessage *ret, VarlinkFds *ret_fds) {
        Envelope e;

        assert_return(in, -EINVAL);
        assert_return(ret, -EINVAL);
        assert_return(!ret_fds || ret_fds->n == 0, -EINVAL);

        int r = input_next_envelope(in, &call_shape, &e, ret_fds);
        if (r > 0)
                *ret = call_message_of(&e);
        return r;
}

int varlink_input_next_reply(VarlinkInput *in, VarlinkReplyMessage *ret) {
        Envelope e;

        assert_return(in, -EINVAL);
        assert_return(ret, -EINVAL);

        int r = input_next_envelope(in, &reply_shape, &e, NULL);
        if (r > 0)
                *ret = reply_message_of(&e);
        return r;
}

int varlink_input_next_with_fds(VarlinkInput *in, json_t **ret, VarlinkFds *ret_fds) {
        const char *data;
        size_t n;
        int r;

        assert_return(in, -EINVAL);
        assert_return(ret, -EINVAL);
        assert_return(!ret_fds || ret_fds->n == 0, -EINVAL);

        r = input_peek_message(in, &data, &n);
        if (r <= 0)
                return r;
        json_t *m = NULL;
        r = json_parse_object(data, n, &m);
        if (r == -ENOMEM)
                return r;
        input_take_message(in, n, r < 0 ? NULL : ret_fds);
        if (r < 0)
                return r;
        *ret = m;
        return 1;
}

/* ---- output ---- */

struct VarlinkChunk {
        VarlinkChunk *next;
        size_t start, end, allocated;
        VarlinkFds fds;  /* to pass with the first byte: the chunk then holds that one message, and is full */
        const char *shared; /* bytes of the caller's instead of data (varlink_output_enqueue_shared()); full */
        void (*release)(void *userdata);
        void *userdata;
        char data[];
};

static const char *chunk_data(const VarlinkChunk *c) {
        return c->shared ?: c->data;
}

/* Small replies share a chunk; a larger message gets one of its own size. */
#define CHUNK_SIZE_MIN ((size_t) 4096 - sizeof(VarlinkChunk))
/* sendmsg() with this many chunks at most per call. */
#define FLUSH_IOV_MAX 16

void varlink_output_init(VarlinkOutput *out, size_t max_pending) {
        *out = (VarlinkOutput) {
                .max = max_pending > 0 ? max_pending : VARLINK_OUTPUT_MAX_DEFAULT,
        };
}

static void chunk_free(VarlinkChunk *c) {
        varlink_fds_close(&c->fds);
        if (c->release)
                c->release(c->userdata);
        free(c);
}

void varlink_output_done(VarlinkOutput *out) {
        while (out->head) {
                VarlinkChunk *c = out->head;
                out->head = c->next;
                chunk_free(c);
        }
        out->tail = NULL;
        out->pending = 0;
}

/* A position in the queue, to take back a message that did not fit. */
typedef struct OutputMark {
        VarlinkChunk *tail;
        size_t tail_end;
        size_t pending;
} OutputMark;

static OutputMark output_mark(const VarlinkOutput *out) {
        return (OutputMark) {
                .tail = out->tail,
                .tail_end = out->tail ? out->tail->end : 0,
                .pending = out->pending,
        };
}

static void output_rollback(VarlinkOutput *out, const OutputMark *m) {
        VarlinkChunk *c = m->tail ? m->tail->next : out->head;
        while (c) {
                VarlinkChunk *next = c->next;
                chunk_free(c);
                c = next;
        }
        if (m->tail) {
                m->tail->next = NULL;
                m->tail->end = m->tail_end;
        } else
                out->head = NULL;
        out->tail = m->tail;
        out->pending = m->pending;
}

static int output_append(VarlinkOutput *out, const void *data, size_t size) {
        if (size > out->max - out->pending)
                return -ENOBUFS;

        VarlinkChunk *t = out->tail;
        size_t room = t ? t->allocated - t->end : 0;
        size_t k = MIN(room, size);
        if (k > 0) {
                memcpy(t->data + t->end, data, k);
                t->end += k;
        }
        if (k < size) {
                size_t n = size - k, a = MAX(n, CHUNK_SIZE_MIN);
                VarlinkChunk *c = malloc(sizeof(VarlinkChunk) + a);
                if (!c)
                        return -ENOMEM;
                *c = (VarlinkChunk) { .end = n, .allocated = a };
                memcpy(c->data, (const char *) data + k, n);
                if (t)
                        t->next = c;
                else
                        out->head = c;
                out->tail = c;
        }
        out->pending += size;
        return 0;
}

int varlink_output_enqueue(VarlinkOutput *out, const void *data, size_t size) {
        OutputMark m;
        int r;

        assert_return(out, -EINVAL);
        assert_return(data || size == 0, -EINVAL);

        m = output_mark(out);
        r = output_append(out, data, size);
        if (r < 0)
                output_rollback(out, &m);
        return r;
}

/* A chunk of its own, full, at the end of the queue. */
static void output_link(VarlinkOutput *out, VarlinkChunk *c) {
        if (out->tail)
                out->tail->next = c;
        else
                out->head = c;
        out->tail = c;
        out->pending += c->end;
}

int varlink_output_enqueue_shared(VarlinkOutput *out, const void *data, size_t size, void (*release)(void *userdata),
                                  void *userdata) {
        assert_return(out, -EINVAL);
        assert_return(data && size > 0, -EINVAL);

        if (size > out->max - out->pending)
                return -ENOBUFS;
        VarlinkChunk *c = malloc(sizeof(VarlinkChunk));
        if (!c)
                return -ENOMEM;
        /* Full (allocated == end): nothing is appended to it. */
        *c = (VarlinkChunk) { .end = size, .allocated = size, .shared = data, .release = release, .userdata = userdata };
        output_link(out, c);
        return 0;
}

static int file_sink(const char *data, size_t size, void *userdata) {
        return fwrite(data, 1, size, userdata) == size ? 0 : -ENOMEM;
}

static int output_sink(const char *data, size_t size, void *userdata) {
        return output_append(userdata, data, size);
}

/* Serializes value straight into the queue, with the NUL that ends a message or without it. */
static int output_enqueue_json(VarlinkOutput *out, const json_t *value, bool end) {
        OutputMark m;
        int r;

        /* Serialized straight into the queue: a large Status reply is never built twice. */
        m = output_mark(out);
        r = json_serialize(value, output_sink, out);
        if (r >= 0 && end)
                r = output_append(out, "", 1);
        if (r < 0)
                output_rollback(out, &m);
        return r;
}

/* A chunk of its own, of exactly the message's size (text, its NUL included): nothing is appended to it, so
 * the sendmsg() that carries the fds carries no byte of another message. */
static int output_enqueue_chunk_with_fds(VarlinkOutput *out, const char *text, size_t size, const int *fds,
                                         size_t n_fds) {
        if (size > out->max - out->pending)
                return -ENOBUFS;
        VarlinkChunk *c = malloc(sizeof(VarlinkChunk) + size);
        if (!c)
                return -ENOMEM;
        *c = (VarlinkChunk) { .end = size, .allocated = size };
        memcpy(c->data, text, size);
        for (size_t i = 0; i < n_fds; i++) {
                c->fds.fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
                if (c->fds.fds[i] < 0) {
                        int r = negative_errno();
                        chunk_free(c);
                        return r;
                }
                c->fds.n++;
        }
        output_link(out, c);
        return 0;
}

int varlink_output_enqueue_json_with_fds(VarlinkOutput *out, const json_t *msg, const int *fds, size_t n_fds) {
        _cleanup_free_ char *text = NULL;
        size_t size;
        int r;

        assert_return(out, -EINVAL);
        assert_return(fds || n_fds == 0, -EINVAL);
        assert_return(n_fds <= VARLINK_FDS_MAX, -EINVAL);

        if (n_fds == 0)
                return varlink_output_enqueue_json(out, msg);
        /* Rare (one per Acquire at most): formatted first. */
        r = varlink_message_format(msg, &text, &size);
        if (r < 0)
                return r;
        return output_enqueue_chunk_with_fds(out, text, size, fds, n_fds);
}

/* The SCM_RIGHTS control message for fds, in a buffer of the caller's. */
typedef union FdsControl {
        struct cmsghdr header;
        uint8_t buffer[CMSG_SPACE(sizeof(int) * VARLINK_FDS_MAX)];
} FdsControl;

static void msghdr_set_fds(struct msghdr *mh, FdsControl *control, const VarlinkFds *fds) {
        memset(control, 0, sizeof *control);
        mh->msg_control = control;
        mh->msg_controllen = CMSG_SPACE(sizeof(int) * fds->n);
        struct cmsghdr *cm = CMSG_FIRSTHDR(mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * fds->n);
        memcpy(CMSG_DATA(cm), fds->fds, sizeof(int) * fds->n);
}

int varlink_output_enqueue_json(VarlinkOutput *out, const json_t *msg) {
        assert_return(out, -EINVAL);
        assert_return(json_is_object(msg), -EINVAL);

        return output_enqueue_json(out, msg, true);
}

int varlink_output_enqueue_json_part(VarlinkOutput *out, const json_t *value) {
        assert_return(out, -EINVAL);
        assert_return(value, -EINVAL);

        return output_enqueue_json(out, value, false);
}

int varlink_output_copy(const VarlinkOutput *out, void **ret, size_t *ret_size) {
        assert_return(out && ret && ret_size, -EINVAL);
        if (out->pending == 0) {
                *ret = NULL;
                *ret_size = 0;
                return 0;
        }
        char *buf = malloc(out->pending), *p = buf;
        if (!buf)
                return -ENOMEM;
        for (const VarlinkChunk *c = out->head; c; c = c->next) {
                if (c->fds.n > 0) {
                        free(buf);
                        return -EBUSY;
                }
                memcpy(p, chunk_data(c) + c->start, c->end - c->start);
                p += c->end - c->start;
        }
        *ret = buf;
        *ret_size = (size_t) (p - buf);
        return 0;
}

int varlink_output_flush(VarlinkOutput *out, int fd) {
        assert_return(out, -EINVAL);
        assert_return(fd >= 0, -EBADF);

        while (out->head) {
                struct iovec iov[FLUSH_IOV_MAX];
                size_t n_iov = 0;
                FdsControl control;

                for (VarlinkChunk *c = out->head; c && n_iov < FLUSH_IOV_MAX; c = c->next) {
                        /* A message with fds goes in a sendmsg() of its own (see VarlinkInput). */
                        if (c->fds.n > 0 && n_iov > 0)
                                break;
                        iov[n_iov++] = (struct iovec) { (char *) chunk_data(c) + c->start, c->end - c->start };
                        if (c->fds.n > 0)
                                break;
                }

                struct msghdr mh = { .msg_iov = iov, .msg_iovlen = n_iov };
                if (out->head->fds.n > 0)
                        msghdr_set_fds(&mh, &control, &out->head->fds);
                ssize_t k = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EWOULDBLOCK)
                                return -EAGAIN;
                        return negative_errno();
                }

                if (k == 0)
                        return -EIO; /* cannot happen on a stream socket: never spin on it */
                /* They went with the first byte: the peer has its own now. */
                varlink_fds_close(&out->head->fds);

                /* Drop what went out; a partial write leaves the first chunk with an offset. */
                size_t sent = (size_t) k;
                out->pending -= sent;
                while (sent > 0) {
                        VarlinkChunk *c = out->head;
                        size_t d = MIN(sent, c->end - c->start);
                        c->start += d;
                        sent -= d;
                        if (c->start == c->end) {
                                out->head = c->next;
                                chunk_free(c);
                        }
                }
                if (!out->head)
                        out->tail = NULL;
        }
        return 0;
}

/* ---- stream ---- */

void varlink_stream_init(VarlinkStream *s, int fd, size_t max_message, size_t max_output) {
        *s = (VarlinkStream) { .fd = fd };
        varlink_input_init(&s->input, max_message);
        varlink_output_init(&s->output, max_output);
}

void varlink_stream_done(VarlinkStream *s) {
        if (!s)
                return;
        varlink_input_done(&s->input);
        varlink_output_done(&s->output);
        s->fd = -EBADF;
}

void varlink_stream_accept_fds(VarlinkStream *s, bool accept) {
        if (s)
                s->accept_fds = accept;
}

/* The most fds one sendmsg() can pass (the kernel's SCM_MAX_FD). */
#define RECV_FDS_MAX 253

/* recv() for a stream that accepts fds: recvmsg() with room for as many as one sendmsg() can pass, each
 * made O_CLOEXEC by the kernel as it arrives. Returns as recv() does, with the fds in *ret_fds; more than
 * VARLINK_FDS_MAX (or MSG_CTRUNC) is -1 with errno ETOOMANYREFS, after closing the ones received. Room for
 * all of them, although only VARLINK_FDS_MAX are kept: those the kernel cannot hand over it closes itself,
 * in this thread, and such a last close() may block (varlink_set_received_fd_closer()). Any other control
 * message is ignored: none carries a resource. */
static ssize_t stream_recv_with_fds(int fd, void *buf, size_t size, VarlinkFds *ret_fds) {
        union {
                struct cmsghdr header;
                uint8_t buffer[CMSG_SPACE(sizeof(int) * RECV_FDS_MAX)];
        } control;
        struct iovec iov = { buf, size };
        struct msghdr mh = {
                .msg_iov = &iov,
                .msg_iovlen = 1,
                .msg_control = &control,
                .msg_controllen = sizeof control,
        };

        ssize_t k = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (k < 0)
                return k;
        bool too_many = mh.msg_flags & MSG_CTRUNC;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
                if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                        continue;
                size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < n; i++) {
                        int received;
                        memcpy(&received, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                        if (ret_fds->n < VARLINK_FDS_MAX)
                                ret_fds->fds[ret_fds->n++] = received;
                        else {
                                received_fd_close(received);
                                too_many = true;
                        }
                }
        }
        if (too_many) {
                varlink_fds_close(ret_fds);
                errno = ETOOMANYREFS;
                return -1;
        }
        return k;
}

/* The receive itself: at most n bytes into buf, and with fds (into ret_fds, when not NULL) if the stream
 * accepts them. Returns the number of bytes, 0 at EOF, -EAGAIN, or another negative errno; sets
 * s->drained. */
static ssize_t stream_recv(VarlinkStream *s, void *buf, size_t n, VarlinkFds *ret_fds) {
        for (;;) {
                ssize_t k = ret_fds ? stream_recv_with_fds(s->fd, buf, n, ret_fds) : recv(s->fd, buf, n, MSG_DONTWAIT);
                if (k < 0 && errno == EINTR)
                        continue;
                /* A read that brought fds ends where they came, whatever follows: not a sign of an empty socket. */
                s->drained = k >= 0 && (size_t) k < n && (!ret_fds || ret_fds->n == 0);
                if (k < 0)
                        return errno == EWOULDBLOCK ? -EAGAIN : negative_errno();
                return k;
        }
}

ssize_t varlink_stream_read(VarlinkStream *s) {
        VarlinkInput *in;
        int r;

        assert_return(s, -EINVAL);
        assert_return(s->fd >= 0, -EBADF);

        in = &s->input;
        /* Never more than one message's worth beyond what is buffered: bounded memory per connection,
         * and once the caller has taken every whole message the partial one always has room to end. */
        size_t pending = varlink_input_pending(in);
        if (pending > in->max)
                return -ENOBUFS;
        size_t room = in->max + 1 - pending;

        /* Read on the stack, keep what came: the input then holds what the peer sent, not a read's
         * worth. 4,000 connections dripping a byte at a time held 32 KiB each (128 MB, a page fault or
         * two each as it grew); the copy costs less than the parse that follows. */
        char scratch[VARLINK_READ_SIZE];
        VarlinkFds fds = VARLINK_FDS_INIT;
        ssize_t k = stream_recv(s, scratch, MIN(room, sizeof scratch), s->accept_fds ? &fds : NULL);
        if (k <= 0) {
                varlink_fds_close(&fds);
                if (pending == 0)
                        input_release(in); /* a wakeup for nothing keeps no buffer */
                return k;
        }
        r = varlink_input_feed(in, scratch, (size_t) k);
        if (r < 0) {
                varlink_fds_close(&fds);
                return r;
        }
        /* After their bytes: the fds belong to the message that holds the last byte read with them. */
        r = varlink_input_feed_fds(in, fds.fds, fds.n);
        if (r < 0)
                return r;
        return k;
}

int varlink_stream_next(VarlinkStream *s, json_t **ret) {
        assert_return(s, -EINVAL);
        return varlink_input_next(&s->input, ret);
}

int varlink_stream_next_with_fds(VarlinkStream *s, json_t **ret, VarlinkFds *ret_fds) {
        assert_return(s, -EINVAL);
        return varlink_input_next_with_fds(&s->input, ret, ret_fds);
}

int varlink_stream_next_call_with_fds(VarlinkStream *s, VarlinkCallMessage *ret, VarlinkFds *ret_fds) {
        assert_return(s, -EINVAL);
        return varlink_input_next_call_with_fds(&s->input, ret, ret_fds);
}

int varlink_stream_next_reply(VarlinkStream *s, VarlinkReplyMessage *ret) {
        assert_return(s, -EINVAL);
        return varlink_input_next_reply(&s->input, ret);
}

int varlink_stream_enqueue(VarlinkStream *s, const json_t *msg) {
        assert_return(s, -EINVAL);
        return varlink_output_enqueue_json(&s->output, msg);
}

/* Writes {"method":"METHOD","parameters":PARAMETERS<tail>} and its NUL to sink without building the envelope
 * as a json_t (a new object and two or three keys hashed, for every call and every reply): the bytes of
 * varlink_call_format() and varlink_reply_format(), which a unit test compares. method (a qualified name:
 * nothing to escape) may be NULL for a reply; the parameters are a tree, or text already written (neither: {}). */
static int envelope_write(JsonSink sink, void *userdata, const char *method, const json_t *parameters,
                          const char *text, size_t text_size, const char *tail) {
        int r;

        if (method) {
                r = sink("{\"method\":\"", 11, userdata);
                if (r >= 0)
                        r = sink(method, strlen(method), userdata);
                if (r >= 0)
                        r = sink("\",\"parameters\":", 15, userdata);
        } else
                r = sink("{\"parameters\":", 14, userdata);
        if (r >= 0)
                r = parameters ? json_serialize(parameters, sink, userdata) :
                    text       ? sink(text, text_size, userdata) :
                                 sink("{}", 2, userdata);
        if (r >= 0)
                r = sink(tail, strlen(tail) + 1, userdata); /* with the NUL that ends the message */
        return r;
}

/* Queues that envelope, or nothing. */
static int output_enqueue_envelope_text(VarlinkOutput *out, const char *method, const json_t *parameters,
                                        const char *text, size_t text_size, const char *tail) {
        OutputMark m = output_mark(out);
        int r = envelope_write(output_sink, out, method, parameters, text, text_size, tail);
        if (r < 0)
                output_rollback(out, &m);
        return r;
}

static int output_enqueue_envelope(VarlinkOutput *out, const char *method, const json_t *parameters, const char *tail) {
        return output_enqueue_envelope_text(out, method, parameters, NULL, 0, tail);
}

/* What follows a call's parameters, in varlink_call_new()'s order of keys; tail holds 64 bytes. */
static void call_tail(VarlinkCallFlags flags, char *tail) {
        tail[0] = '\0';
        if (flags & VARLINK_CALL_MORE)
                strcat(tail, ",\"more\":true");
        if (flags & VARLINK_CALL_ONEWAY)
                strcat(tail, ",\"oneway\":true");
        if (flags & VARLINK_CALL_UPGRADE)
                strcat(tail, ",\"upgrade\":true");
        strcat(tail, "}");
}

static bool call_flags_valid(VarlinkCallFlags flags) {
        return (flags & ~(VARLINK_CALL_MORE | VARLINK_CALL_ONEWAY | VARLINK_CALL_UPGRADE)) == 0 &&
               !((flags & VARLINK_CALL_MORE) && (flags & VARLINK_CALL_ONEWAY));
}

int varlink_stream_call(VarlinkStream *s, const char *method, json_t *parameters, VarlinkCallFlags flags) {
        assert_return(s, -EINVAL);
        assert_return(varlink_qualified_name_valid(method), -EINVAL);
        assert_return(!parameters || json_is_object(parameters), -EINVAL);
        assert_return(call_flags_valid(flags), -EINVAL);

        char tail[64];
        call_tail(flags, tail);
        return output_enqueue_envelope(&s->output, method, parameters, tail);
}

int varlink_stream_call_text(VarlinkStream *s, const char *method, const char *parameters, size_t size,
                             VarlinkCallFlags flags, const int *fds, size_t n_fds) {
        assert_return(s, -EINVAL);
        assert_return(varlink_qualified_name_valid(method), -EINVAL);
        assert_return(parameters && size >= 2 && parameters[0] == '{' && parameters[size - 1] == '}', -EINVAL);
        assert_return(!memchr(parameters, 0, size), -EINVAL);
        assert_return(call_flags_valid(flags), -EINVAL);
        assert_return(fds || n_fds == 0, -EINVAL);
        assert_return(n_fds <= VARLINK_FDS_MAX, -EINVAL);

        char tail[64];
        call_tail(flags, tail);
        if (n_fds == 0)
                return output_enqueue_envelope_text(&s->output, method, NULL, parameters, size, tail);

        /* The message whole first, for a chunk of its own with the fds (one per Acquire at most). */
        _cleanup_free_ char *text = NULL;
        size_t total = 0;
        FILE *f = open_memstream(&text, &total);
        if (!f)
                return -ENOMEM;
        int r = envelope_write(file_sink, f, method, NULL, parameters, size, tail);
        if (fclose(f) != 0 && r >= 0) /* sets text and total */
                r = -ENOMEM;
        if (r < 0)
                return r;
        return output_enqueue_chunk_with_fds(&s->output, text, total, fds, n_fds);
}

int varlink_stream_reply(VarlinkStream *s, json_t *parameters, VarlinkReplyFlags flags) {
        assert_return(s, -EINVAL);
        assert_return(!parameters || json_is_object(parameters), -EINVAL);
        assert_return((flags & ~VARLINK_REPLY_CONTINUES) == 0, -EINVAL);

        return output_enqueue_envelope(&s->output, NULL, parameters,
                                       flags & VARLINK_REPLY_CONTINUES ? ",\"continues\":true}" : "}");
}

int varlink_stream_reply_text(VarlinkStream *s, const char *parameters, size_t size, VarlinkReplyFlags flags) {
        assert_return(s, -EINVAL);
        assert_return(parameters && size >= 2 && parameters[0] == '{' && parameters[size - 1] == '}', -EINVAL);
        assert_return(!memchr(parameters, 0, size), -EINVAL);
        assert_return((flags & ~VARLINK_REPLY_CONTINUES) == 0, -EINVAL);

        return output_enqueue_envelope_text(&s->output, NULL, NULL, parameters, size,
                                            flags & VARLINK_REPLY_CONTINUES ? ",\"continues\":true}" : "}");
}

int varlink_stream_reply_error(VarlinkStream *s, const char *error, json_t *parameters) {
        _cleanup_(json_decrefp) json_t *m = NULL;
        int r;

        assert_return(s, -EINVAL);

        r = varlink_error_new(error, parameters, &m);
        if (r < 0)
                return r;
        return varlink_stream_enqueue(s, m);
}

int varlink_stream_reply_error_string(VarlinkStream *s, const char *error, const char *key, const char *value) {
        _cleanup_(json_decrefp) json_t *p = NULL;
        int r;

        assert_return(key, -EINVAL);
        assert_return(value, -EINVAL);

        r = json_build(&p, "{s:s}", key, value);
        if (r < 0)
                return r;
        return varlink_stream_reply_error(s, error, p);
}

int varlink_stream_flush(VarlinkStream *s) {
        assert_return(s, -EINVAL);
        return varlink_output_flush(&s->output, s->fd);
}
