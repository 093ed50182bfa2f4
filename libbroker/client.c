/* SPDX-License-Identifier: MIT */
/* client.c — libbroker's client side of io.slotbroker: connections, Acquire as a stream of events,
 * one-reply calls, leases. Framing and JSON come from varlink.c and json.c; nothing here logs. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "broker.h"
#include "json.h"
#include "macro.h"
#include "strv.h"
#include "varlink.h"

#define INTERFACE "io.slotbroker"
#define SYSTEM_SOCKET_PATH "/run/brokerd/io.slotbroker"
#define USER_SOCKET_SUFFIX "/brokerd/io.slotbroker"

/* The first layouts of the extensible structs: a caller built against this header passes at least
 * these sizes. Fields appended later keep zero as "not given", or get their "not given" from
 * options_copy() for callers that do not know them. */
#define ACQUIRE_OPTIONS_SIZE_V1 offsetof(BrokerAcquireOptions, pidfd)
#define ACQUIRE_OPTIONS_SIZE_V2 (offsetof(BrokerAcquireOptions, pidfd) + sizeof(int))
#define ACQUIRE_LABELS_MAX 32
#define EVENT_SIZE_V1 offsetof(BrokerEvent, fence_in_ms)

typedef enum ClientState {
        CLIENT_IDLE,      /* no call open: broker_call() may use the connection */
        CLIENT_ACQUIRING, /* Acquire sent, neither granted nor refused yet */
        CLIENT_HOLDING,   /* granted; the call stays open for "released" or "revoked" */
        CLIENT_BROKEN,    /* EOF or a protocol error: nothing more comes on this connection */
} ClientState;

struct BrokerClient {
        int fd;
        char *socket_path;
        VarlinkStream stream;
        ClientState state;
        bool acquire_detach;   /* the open Acquire asked for a detached lease */
        /* The open Acquire asked for fence: the same call without it, and a copy of its pidfd, for a broker
         * that refuses the parameter it does not know (an older one): it is then asked again without. */
        char *unfenced;         /* the parameters' text */
        size_t unfenced_size;
        int unfenced_pidfd;

        /* The message behind the last event: the event's strings point into it. */
        VarlinkReplyMessage current;
        /* The Acquire's last reply, read ahead of the reply of a Release on this connection: the next
         * broker_client_process() reports it. None while its parameters are NULL. */
        VarlinkReplyMessage deferred;
        char *held_lease_id;   /* while HOLDING: the id of the lease this connection holds */
        bool release_pending;  /* broker_release_start()'s Release is not answered yet */

        /* The last refusal or error of a call, for messages. */
        char *error_name;
        char *error_parameters;
        unsigned retry_after_sec;
};

struct BrokerLease {
        char *json;
        char *id;
        char *pool;
        char *lane;
        char *job;
        uint64_t token;
        unsigned *slots;
        char **members; /* NULL, or n_slots names */
        size_t n_slots;
        uint64_t granted_at;
        uint64_t expires_at;
        /* An all-or-nothing lease's further pools (a lane with also=): each a lease object of its own with
         * their pool, token, slots and members (id, lane, job and times the parent's), owned here. */
        BrokerLease **also;
        size_t n_also;
};

static const struct {
        const char *name;
        int result;
} error_table[] = {
        { "io.slotbroker.Busy", BROKER_REFUSED_BUSY },
        { "io.slotbroker.QueueFull", BROKER_REFUSED_FULL },
        { "io.slotbroker.QueueTimeout", BROKER_REFUSED_TIMEOUT },
        { "io.slotbroker.QueueShed", BROKER_REFUSED_SHED },
        { "io.slotbroker.Unavailable", BROKER_REFUSED_UNAVAILABLE },
        { "io.slotbroker.NoSuchLane", BROKER_NO_SUCH_LANE },
        { "io.slotbroker.PermissionDenied", BROKER_PERMISSION_DENIED },
        { VARLINK_ERROR_PERMISSION_DENIED, BROKER_PERMISSION_DENIED },
        { "io.slotbroker.InvalidParameter", BROKER_INVALID_PARAMETER },
        { VARLINK_ERROR_INVALID_PARAMETER, BROKER_INVALID_PARAMETER },
        { "io.slotbroker.NoSuchLease", BROKER_NO_SUCH_LEASE },
        { "io.slotbroker.NoSuchPool", BROKER_NO_SUCH_POOL },
        { "io.slotbroker.ReloadFailed", BROKER_RELOAD_FAILED },
        { VARLINK_ERROR_METHOD_NOT_FOUND, BROKER_METHOD_NOT_FOUND },
        { VARLINK_ERROR_METHOD_NOT_IMPLEMENTED, BROKER_METHOD_NOT_FOUND },
        { VARLINK_ERROR_INTERFACE_NOT_FOUND, BROKER_METHOD_NOT_FOUND },
};

static const char *const result_table[_BROKER_RESULT_MAX] = {
        [BROKER_GRANTED] = "granted",
        [BROKER_REFUSED_BUSY] = "busy",
        [BROKER_REFUSED_FULL] = "full",
        [BROKER_REFUSED_TIMEOUT] = "timeout",
        [BROKER_REFUSED_SHED] = "shed",
        [BROKER_REFUSED_UNAVAILABLE] = "unavailable",
        [BROKER_NO_SUCH_LANE] = "no-such-lane",
        [BROKER_PERMISSION_DENIED] = "permission-denied",
        [BROKER_INVALID_PARAMETER] = "invalid-parameter",
        [BROKER_NO_SUCH_LEASE] = "no-such-lease",
        [BROKER_NO_SUCH_POOL] = "no-such-pool",
        [BROKER_RELOAD_FAILED] = "reload-failed",
        [BROKER_METHOD_NOT_FOUND] = "method-not-found",
        [BROKER_ERROR_OTHER] = "error",
};

static const char *const event_table[_BROKER_EVENT_MAX] = {
        [BROKER_EVENT_NONE] = "none",
        [BROKER_EVENT_QUEUED] = "queued",
        [BROKER_EVENT_GRANTED] = "granted",
        [BROKER_EVENT_REFUSED] = "refused",
        [BROKER_EVENT_RELEASED] = "released",
        [BROKER_EVENT_REVOKED] = "revoked",
        [BROKER_EVENT_HELD] = "held",
};

_public_ const char *broker_result_to_string(int result) {
        return result >= 0 && result < _BROKER_RESULT_MAX ? result_table[result] : NULL;
}

_public_ const char *broker_event_type_to_string(BrokerEventType t) {
        return t >= 0 && t < _BROKER_EVENT_MAX ? event_table[t] : NULL;
}

static int error_to_result(const char *name) {
        for (size_t i = 0; i < ELEMENTSOF(error_table); i++)
                if (streq(error_table[i].name, name))
                        return error_table[i].result;
        return BROKER_ERROR_OTHER;
}

/* ---- sockets ---- */

static bool socket_exists(const char *path) {
        struct stat st;
        return stat(path, &st) >= 0 && S_ISSOCK(st.st_mode);
}

_public_ int broker_client_default_socket_path(char **ret) {
        assert_return(ret, -EINVAL);

        const char *e = secure_getenv("SLOTBROKER_SOCKET");
        char *p = NULL;
        if (e && *e)
                p = strdup(e);
        else if (geteuid() != 0) {
                /* A user broker if one runs; else the system one, whose socket group admits CI users. */
                e = secure_getenv("XDG_RUNTIME_DIR");
                if (e && *e ? asprintf(&p, "%s" USER_SOCKET_SUFFIX, e) < 0
                            : asprintf(&p, "/run/user/%u" USER_SOCKET_SUFFIX, (unsigned) geteuid()) < 0)
                        return -ENOMEM;
                if (!socket_exists(p)) {
                        free(p);
                        p = strdup(SYSTEM_SOCKET_PATH);
                }
        } else
                p = strdup(SYSTEM_SOCKET_PATH);
        if (!p)
                return -ENOMEM;
        *ret = p;
        return 0;
}

static int socket_connect(const char *path, int *ret_fd) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        size_t len = strlen(path);
        socklen_t salen;

        if (len == 0)
                return -EINVAL;
        if (len >= sizeof sa.sun_path)
                return -ENAMETOOLONG;
        memcpy(sa.sun_path, path, len);
        if (path[0] == '@') {
                sa.sun_path[0] = '\0'; /* abstract namespace, as systemd spells it */
                salen = (socklen_t) (offsetof(struct sockaddr_un, sun_path) + len);
        } else
                salen = (socklen_t) sizeof sa;

        _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return negative_errno();
        if (connect(fd, (struct sockaddr *) &sa, salen) < 0) {
                if (errno != EINTR && errno != EINPROGRESS)
                        return negative_errno();
                /* Interrupted: the connection proceeds on its own; wait for it rather than connect twice. */
                struct pollfd p = { .fd = fd, .events = POLLOUT };
                int err = 0;
                socklen_t errlen = sizeof err;
                while (poll(&p, 1, -1) < 0)
                        if (errno != EINTR)
                                return negative_errno();
                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &errlen) < 0)
                        return negative_errno();
                if (err != 0)
                        return -err;
        }
        *ret_fd = TAKE_FD(fd);
        return 0;
}

static void client_error_reset(BrokerClient *c) {
        c->error_name = mfree(c->error_name);
        c->error_parameters = mfree(c->error_parameters);
        c->retry_after_sec = 0;
}

/* Remembers an error reply. Returns its BROKER_… code, or -ENOMEM. */
static int client_error_set(BrokerClient *c, const char *name, json_t *parameters) {
        client_error_reset(c);
        c->error_name = strdup(name);
        if (!c->error_name)
                return -ENOMEM;
        if (json_format(parameters, &c->error_parameters, NULL) < 0)
                return -ENOMEM;
        json_t *retry = json_object_get(parameters, "retryAfterSec");
        if (json_is_integer(retry) && json_integer_value(retry) > 0)
                c->retry_after_sec = (unsigned) MIN(json_integer_value(retry), (json_int_t) UINT32_MAX);
        return error_to_result(name);
}

_public_ int broker_client_connect(const char *socket_path, BrokerClient **ret) {
        _cleanup_free_ char *path = NULL;
        int fd, r;

        assert_return(ret, -EINVAL);

        if (socket_path)
                path = strdup(socket_path);
        else if ((r = broker_client_default_socket_path(&path)) < 0)
                return r;
        if (!path)
                return -ENOMEM;

        BrokerClient *c = calloc(1, sizeof(BrokerClient));
        if (!c)
                return -ENOMEM;
        r = socket_connect(path, &fd);
        if (r < 0) {
                free(c);
                return r;
        }
        c->fd = fd;
        c->unfenced_pidfd = -EBADF;
        c->socket_path = TAKE_PTR(path);
        /* Replies may be large (a Status of thousands of waiters); calls are small. */
        varlink_stream_init(&c->stream, fd, VARLINK_REPLY_MAX_DEFAULT, 0);
        c->state = CLIENT_IDLE;
        *ret = c;
        return 0;
}

_public_ BrokerClient *broker_client_free(BrokerClient *c) {
        if (!c)
                return NULL;
        varlink_reply_message_done(&c->current);
        varlink_reply_message_done(&c->deferred);
        free(c->unfenced);
        safe_close(c->unfenced_pidfd);
        free(c->held_lease_id);
        varlink_stream_done(&c->stream);
        safe_close(c->fd);
        client_error_reset(c);
        free(c->socket_path);
        free(c);
        return NULL;
}

_public_ int broker_client_get_fd(const BrokerClient *c) {
        assert_return(c, -EINVAL);
        if (c->state == CLIENT_BROKEN)
                return -ENOTCONN;
        return c->fd;
}

_public_ int broker_client_get_events(const BrokerClient *c) {
        assert_return(c, -EINVAL);
        return POLLIN | (varlink_stream_pending_output(&c->stream) > 0 ? POLLOUT : 0);
}

_public_ const char *broker_client_get_socket_path(const BrokerClient *c) {
        return c ? c->socket_path : NULL;
}

_public_ unsigned broker_client_retry_after_sec(const BrokerClient *c) {
        return c ? c->retry_after_sec : 0;
}

_public_ const char *broker_client_error_name(const BrokerClient *c) {
        return c ? c->error_name : NULL;
}

_public_ const char *broker_client_error_parameters(const BrokerClient *c) {
        return c ? c->error_parameters : NULL;
}

/* The connection is of no further use; a broken pipe and a reset mean the same to callers. */
static int client_break(BrokerClient *c, int error) {
        c->state = CLIENT_BROKEN;
        if (error == -EPIPE || error == 0)
                return -ECONNRESET;
        return error;
}

/* ---- leases ---- */

_public_ BrokerLease *broker_lease_free(BrokerLease *l) {
        if (!l)
                return NULL;
        free(l->json);
        free(l->id);
        free(l->pool);
        free(l->lane);
        free(l->job);
        free(l->slots);
        json_strv_free(l->members);
        for (size_t i = 0; i < l->n_also; i++)
                broker_lease_free(l->also[i]);
        free(l->also);
        free(l);
        return NULL;
}
DEFINE_TRIVIAL_CLEANUP_FUNC(BrokerLease *, broker_lease_free);

/* A lease's slots (and members, NULL or one per slot), checked. Returns 0, -EBADMSG or -ENOMEM. */
static int lease_take_slots(BrokerLease *l, json_t *slots, char ***members) {
        size_t n = json_array_size(slots);
        if (n == 0 || (*members && strv_length(*members) != n))
                return -EBADMSG;
        l->slots = calloc(n, sizeof(unsigned));
        if (!l->slots)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                json_t *v = json_array_get(slots, i);
                if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
                        return -EBADMSG;
                l->slots[i] = (unsigned) json_integer_value(v);
        }
        l->n_slots = n;
        l->members = TAKE_PTR(*members);
        return 0;
}

#define LEASE_ALSO_MAX 64

/* The also= pools of an all-or-nothing lease (io.slotbroker.LeaseAlso), each a lease object of its own. */
static int lease_also_from_json(BrokerLease *l, json_t *also) {
        size_t n = json_array_size(also);
        if (n > LEASE_ALSO_MAX)
                return -EBADMSG;
        l->also = calloc(MAX(n, 1u), sizeof(BrokerLease *));
        if (!l->also)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                const char *pool = NULL;
                int64_t token = 0;
                json_t *slots = NULL;
                _cleanup_(json_strv_freep) char **members = NULL;
                const JsonField table[] = {
                        { "pool", JSON_FIELD_STRING, JSON_MANDATORY, &pool },
                        { "token", JSON_FIELD_INT64, JSON_MANDATORY, &token, 0, INT64_MAX },
                        { "slots", JSON_FIELD_ARRAY, JSON_MANDATORY, &slots, .max_length = 1 << 20 },
                        { "members", JSON_FIELD_STRV, 0, &members, .max_length = 1 << 20 },
                        {},
                };
                json_t *o = json_array_get(also, i);
                int r = json_is_object(o) ? json_dispatch(o, table, JSON_DISPATCH_ALLOW_UNKNOWN, NULL) : -EBADMSG;
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        return -EBADMSG;
                BrokerLease *a = calloc(1, sizeof(BrokerLease));
                if (!a)
                        return -ENOMEM;
                l->also[l->n_also++] = a;
                if ((r = lease_take_slots(a, slots, &members)) < 0)
                        return r;
                if (strdup_or_null(l->id, &a->id) < 0 || strdup_or_null(pool, &a->pool) < 0 ||
                    strdup_or_null(l->lane, &a->lane) < 0 || strdup_or_null(l->job, &a->job) < 0)
                        return -ENOMEM;
                a->token = (uint64_t) token;
                a->granted_at = l->granted_at;
                a->expires_at = l->expires_at;
        }
        return 0;
}

/* Reads an io.slotbroker.Lease. Unknown fields are skipped: a newer broker may add some. Returns 0,
 * -EBADMSG or -ENOMEM. */
static int lease_from_json(json_t *o, BrokerLease **ret) {
        const char *id = NULL, *pool = NULL, *lane = NULL, *job = NULL;
        int64_t token = 0, granted_at = 0, expires_at = 0;
        json_t *slots = NULL, *also = NULL;
        _cleanup_(json_strv_freep) char **members = NULL;
        int r;

        const JsonField table[] = {
                { "id", JSON_FIELD_STRING, JSON_MANDATORY, &id },
                { "token", JSON_FIELD_INT64, JSON_MANDATORY, &token, 0, INT64_MAX },
                { "pool", JSON_FIELD_STRING, JSON_MANDATORY, &pool },
                { "slots", JSON_FIELD_ARRAY, JSON_MANDATORY, &slots, .max_length = 1 << 20 },
                { "members", JSON_FIELD_STRV, 0, &members, .max_length = 1 << 20 },
                { "lane", JSON_FIELD_STRING, JSON_MANDATORY, &lane },
                { "job", JSON_FIELD_STRING, 0, &job },
                { "grantedAt", JSON_FIELD_INT64, 0, &granted_at, 0, INT64_MAX },
                { "expiresAt", JSON_FIELD_INT64, 0, &expires_at, 0, INT64_MAX },
                { "also", JSON_FIELD_ARRAY, 0, &also, .max_length = LEASE_ALSO_MAX },
                {},
        };
        r = json_dispatch(o, table, JSON_DISPATCH_ALLOW_UNKNOWN, NULL);
        if (r == -ENOMEM)
                return r;
        if (r < 0 || !json_is_object(o))
                return -EBADMSG;
        _cleanup_(broker_lease_freep) BrokerLease *l = calloc(1, sizeof(BrokerLease));
        if (!l)
                return -ENOMEM;
        r = lease_take_slots(l, slots, &members);
        if (r < 0)
                return r;
        if (strdup_or_null(id, &l->id) < 0 || strdup_or_null(pool, &l->pool) < 0 ||
            strdup_or_null(lane, &l->lane) < 0 || strdup_or_null(job, &l->job) < 0)
                return -ENOMEM;
        l->token = (uint64_t) token;
        l->granted_at = (uint64_t) granted_at;
        l->expires_at = (uint64_t) expires_at;
        if (also && (r = lease_also_from_json(l, also)) < 0)
                return r;
        r = json_format(o, &l->json, NULL);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(l);
        return 0;
}

_public_ const char *broker_lease_id(const BrokerLease *l) {
        return l ? l->id : NULL;
}

_public_ const char *broker_lease_pool(const BrokerLease *l) {
        return l ? l->pool : NULL;
}

_public_ const char *broker_lease_lane(const BrokerLease *l) {
        return l ? l->lane : NULL;
}

_public_ const char *broker_lease_job(const BrokerLease *l) {
        return l ? l->job : NULL;
}

_public_ uint64_t broker_lease_token(const BrokerLease *l) {
        return l ? l->token : 0;
}

_public_ size_t broker_lease_n_slots(const BrokerLease *l) {
        return l ? l->n_slots : 0;
}

_public_ int broker_lease_slot(const BrokerLease *l, size_t i) {
        assert_return(l, -EINVAL);
        assert_return(i < l->n_slots, -ERANGE);
        return (int) l->slots[i];
}

_public_ const char *broker_lease_member(const BrokerLease *l, size_t i) {
        if (!l || !l->members || i >= l->n_slots)
                return NULL;
        return l->members[i];
}

_public_ size_t broker_lease_n_also(const BrokerLease *l) {
        return l ? l->n_also : 0;
}

_public_ const BrokerLease *broker_lease_also(const BrokerLease *l, size_t i) {
        if (!l || i >= l->n_also)
                return NULL;
        return l->also[i];
}

_public_ uint64_t broker_lease_granted_at(const BrokerLease *l) {
        return l ? l->granted_at : 0;
}

_public_ uint64_t broker_lease_expires_at(const BrokerLease *l) {
        return l ? l->expires_at : 0;
}

_public_ const char *broker_lease_json(const BrokerLease *l) {
        return l ? l->json : NULL;
}

/* ---- Acquire ---- */

/* Copies the caller's options into this version's layout: a shorter struct (an older caller) is
 * padded with what "not given" is for the fields it lacks; a longer one (a newer caller) is accepted only
 * if what we do not know is zero. */
static int options_copy(const BrokerAcquireOptions *o, BrokerAcquireOptions *ret) {
        if (o->size < ACQUIRE_OPTIONS_SIZE_V1)
                return -EINVAL;
        for (size_t i = sizeof(BrokerAcquireOptions); i < o->size; i++)
                if (((const uint8_t *) o)[i] != 0)
                        return -E2BIG;
        *ret = BROKER_ACQUIRE_OPTIONS_INIT;
        memcpy(ret, o, MIN(o->size, sizeof(BrokerAcquireOptions)));
        ret->size = sizeof(BrokerAcquireOptions);
        if (o->size < ACQUIRE_OPTIONS_SIZE_V2)
                ret->pidfd = -1; /* V1 had no pidfd: its zero padding is not fd 0 */
        return 0;
}

/* The caller's labels, counted: at most ACQUIRE_LABELS_MAX. */
static int labels_count(const BrokerAcquireOptions *o, size_t *ret) {
        size_t n = 0;
        while (o->labels && o->labels[n])
                if (++n > ACQUIRE_LABELS_MAX)
                        return -EINVAL;
        *ret = n;
        return 0;
}

/* "labels" and "member", as Acquire and Reserve both take them. */
static void selector_write(const BrokerAcquireOptions *o, size_t n_labels, JsonText *t) {
        if (n_labels > 0) {
                json_text_key(t, "labels");
                json_text_open(t, '[');
                for (size_t i = 0; i < n_labels; i++)
                        json_text_string(t, o->labels[i]);
                json_text_close(t, ']');
        }
        if (o->member) {
                json_text_key(t, "member");
                json_text_string(t, o->member);
        }
}

/* Reserve's parameters (SPEC §3.6). */
static int reserve_parameters(const BrokerAcquireOptions *o, JsonText *t) {
        size_t n_labels;

        if (!*o->reserve_pool || !o->reason || o->max_hold_ms == 0 || o->max_hold_ms > (uint64_t) INT64_MAX / 1000)
                return -EINVAL;
        if (labels_count(o, &n_labels) < 0)
                return -EINVAL;
        json_text_open(t, '{');
        json_text_key(t, "pool");
        json_text_string(t, o->reserve_pool);
        json_text_key(t, "forMs");
        json_text_integer(t, (int64_t) o->max_hold_ms);
        json_text_key(t, "reason");
        json_text_string(t, o->reason);
        selector_write(o, n_labels, t);
        json_text_close(t, '}');
        return json_text_result(t); /* -EINVAL: a string not UTF-8 */
}

/* The Acquire's parameters, written as text (no tree built and freed per call), with "fence" or without. */
static int acquire_parameters(const BrokerAcquireOptions *o, bool fence, JsonText *t) {
        size_t n_labels;

        if (o->reserve_pool)
                return reserve_parameters(o, t);

        if (!o->lane || !*o->lane)
                return -EINVAL;
        if (o->queue_wait_ms > INT32_MAX)
                return -EINVAL;
        if (o->detach && o->max_hold_ms == 0)
                return -EINVAL; /* a detached lease needs an end of its own */
        if (o->max_hold_ms > (uint64_t) INT64_MAX / 1000 || o->pid < 0 || o->slots > INT32_MAX)
                return -EINVAL;
        if (o->pid > 0 && o->pidfd >= 0)
                return -EINVAL; /* one command, named once */
        if (o->wait < BROKER_WAIT_DEFAULT || o->wait > BROKER_WAIT_NO)
                return -EINVAL;
        if (labels_count(o, &n_labels) < 0)
                return -EINVAL;

        json_text_open(t, '{');
        json_text_key(t, "lane");
        json_text_string(t, o->lane);
        if (o->slots > 0) {
                json_text_key(t, "slots");
                json_text_integer(t, o->slots);
        }
        if (o->wait != BROKER_WAIT_DEFAULT) {
                json_text_key(t, "wait");
                json_text_bool(t, o->wait == BROKER_WAIT_YES);
        }
        if (o->queue_wait_ms > 0) {
                json_text_key(t, "queueWaitMs");
                json_text_integer(t, (int64_t) o->queue_wait_ms);
        }
        if (o->job) {
                json_text_key(t, "job");
                json_text_string(t, o->job);
        }
        if (o->pid > 0) {
                json_text_key(t, "pid");
                json_text_integer(t, o->pid);
        }
        if (o->pidfd >= 0) {
                json_text_key(t, "pidfd");
                json_text_integer(t, 0); /* the first fd passed with the call */
        }
        if (o->reclaim) {
                json_text_key(t, "reclaim");
                json_text_string(t, o->reclaim);
        }
        if (o->detach) {
                json_text_key(t, "detach");
                json_text_bool(t, true);
        }
        if (o->max_hold_ms > 0) {
                json_text_key(t, "maxHoldMs");
                json_text_integer(t, (int64_t) o->max_hold_ms);
        }
        selector_write(o, n_labels, t);
        if (fence) {
                json_text_key(t, "fence");
                json_text_bool(t, true);
        }
        json_text_close(t, '}');
        /* -EINVAL: a string of the caller's is not UTF-8 (json_string() refused the same). */
        return json_text_result(t);
}

static const char *json_string_member(json_t *o, const char *key) {
        return json_string_value(json_object_get(o, key)); /* NULL when absent or not a string */
}

/* The Acquire's first answer came: the broker knows every parameter it was sent. */
static void acquire_unfenced_forget(BrokerClient *c) {
        c->unfenced = mfree(c->unfenced);
        c->unfenced_pidfd = safe_close(c->unfenced_pidfd);
}

/* A broker that does not know "fence" refuses it as an unknown parameter (json_dispatch() names the first
 * key it does not know): the same Acquire goes again without it, and the lease is simply not fenced. Returns
 * 1 when the error was that and the call was sent again, 0 when it was another, or a negative errno. */
static int acquire_retry_unfenced(BrokerClient *c, const VarlinkReply *reply) {
        if (!c->unfenced || error_to_result(reply->error) != BROKER_INVALID_PARAMETER ||
            !streq_ptr(json_string_member(reply->parameters, "parameter"), "fence"))
                return 0;
        int r = varlink_stream_call_text(&c->stream, INTERFACE ".Acquire", c->unfenced, c->unfenced_size,
                                         VARLINK_CALL_MORE, &c->unfenced_pidfd, c->unfenced_pidfd >= 0 ? 1 : 0);
        acquire_unfenced_forget(c);
        if (r < 0)
                return r;
        r = varlink_stream_flush(&c->stream);
        return r < 0 && r != -EAGAIN ? r : 1;
}

_public_ int broker_acquire_start(BrokerClient *c, const BrokerAcquireOptions *options) {
        BrokerAcquireOptions o;
        int r;

        assert_return(c, -EINVAL);
        assert_return(options, -EINVAL);

        _cleanup_(json_text_done) JsonText p; /* after the checks: cleaned up only once initialized */
        json_text_init(&p);
        r = options_copy(options, &o);
        if (r < 0)
                return r;
        if (c->state == CLIENT_BROKEN)
                return -ENOTCONN;
        if (c->state != CLIENT_IDLE)
                return -EBUSY;
        if (o.reserve_pool) {
                o.fence = false, o.detach = true;
                o.pidfd = -1;
        }
        r = acquire_parameters(&o, o.fence, &p);
        if (r < 0)
                return r;

        _cleanup_free_ char *unfenced = NULL;
        size_t unfenced_size = 0;
        _cleanup_close_ int unfenced_pidfd = -EBADF;
        if (o.fence) {
                _cleanup_(json_text_done) JsonText u;
                json_text_init(&u);
                r = acquire_parameters(&o, false, &u);
                if (r < 0)
                        return r;
                unfenced = malloc(u.size);
                if (!unfenced)
                        return -ENOMEM;
                memcpy(unfenced, u.data, u.size);
                unfenced_size = u.size;
                if (o.pidfd >= 0) {
                        unfenced_pidfd = fcntl(o.pidfd, F_DUPFD_CLOEXEC, 3);
                        if (unfenced_pidfd < 0)
                                return -errno;
                }
        }

        client_error_reset(c);
        r = varlink_stream_call_text(&c->stream, o.reserve_pool ? INTERFACE ".Reserve" : INTERFACE ".Acquire", p.data,
                                     p.size, VARLINK_CALL_MORE, &o.pidfd, o.pidfd >= 0 ? 1 : 0);
        if (r < 0)
                return r;
        acquire_unfenced_forget(c);
        c->unfenced = TAKE_PTR(unfenced);
        c->unfenced_size = unfenced_size;
        c->unfenced_pidfd = TAKE_FD(unfenced_pidfd);
        r = varlink_stream_flush(&c->stream);
        if (r < 0 && r != -EAGAIN) /* EAGAIN: the rest goes out from broker_client_process() */
                return client_break(c, r);
        c->state = CLIENT_ACQUIRING;
        c->acquire_detach = o.detach;
        return 0;
}

static uint64_t json_uint_member(json_t *o, const char *key, uint64_t fallback) {
        json_t *v = json_object_get(o, key);
        return json_is_integer(v) && json_integer_value(v) >= 0 ? (uint64_t) json_integer_value(v) : fallback;
}

/* One message of an open Acquire: the event it means, or -EBADMSG when it does not fit the state. */
static int client_handle_message(BrokerClient *c, const VarlinkReplyMessage *msg, BrokerEvent *ev) {
        VarlinkReply reply = varlink_reply_message_reply(msg);
        int r;

        bool continues = reply.flags & VARLINK_REPLY_CONTINUES;

        if (reply.error) {
                if (c->state != CLIENT_ACQUIRING)
                        return -EBADMSG;
                r = acquire_retry_unfenced(c, &reply);
                if (r != 0)
                        return r < 0 ? r : BROKER_EVENT_NONE; /* asked again: no event yet */
                acquire_unfenced_forget(c);
                r = client_error_set(c, reply.error, reply.parameters);
                if (r < 0)
                        return r;
                c->state = CLIENT_IDLE;
                ev->type = BROKER_EVENT_REFUSED;
                ev->refusal = r;
                ev->retry_after_sec = c->retry_after_sec;
                ev->pool = json_string_member(reply.parameters, "pool");
                ev->waited_ms = json_uint_member(reply.parameters, "waitedMs", 0);
                ev->reason = json_string_member(reply.parameters, "reason");
                return ev->type;
        }

        const char *state = json_string_member(reply.parameters, "state");
        if (!state)
                return -EBADMSG;
        acquire_unfenced_forget(c);

        if (c->state == CLIENT_ACQUIRING && streq(state, "queued")) {
                if (!continues)
                        return -EBADMSG;
                json_t *budget = json_object_get(reply.parameters, "budgetMs");
                ev->type = BROKER_EVENT_QUEUED;
                ev->position = (BrokerPosition) {
                        .pool = json_string_member(reply.parameters, "pool"),
                        .position = json_uint_member(reply.parameters, "position", 0),
                        .queued = json_uint_member(reply.parameters, "queued", 0),
                        .budget_ms = json_is_integer(budget) && json_integer_value(budget) >= 0
                                             ? (int64_t) json_integer_value(budget)
                                             : -1,
                };
                return ev->type;
        }
        if (c->state == CLIENT_ACQUIRING && streq(state, "granted")) {
                BrokerLease *l;
                r = lease_from_json(json_object_get(reply.parameters, "lease"), &l);
                if (r < 0)
                        return r;
                /* A detached lease answers once; an attached one keeps the call open as its life line. A
                 * final grant of an attached lease would leave the lease held with nothing more to say. */
                c->state = continues ? CLIENT_HOLDING : c->acquire_detach ? CLIENT_IDLE : CLIENT_HOLDING;
                free(c->held_lease_id);
                c->held_lease_id = c->state == CLIENT_HOLDING ? strdup(l->id) : NULL; /* NULL: only the fast path is lost */
                ev->type = BROKER_EVENT_GRANTED;
                ev->lease = l;
                return ev->type;
        }
        if (c->state == CLIENT_HOLDING && continues && streq(state, "held")) {
                json_t *fence = json_object_get(reply.parameters, "fenceInMs");
                if (!json_is_integer(fence) || json_integer_value(fence) < 0)
                        return -EBADMSG;
                json_t *kill = json_object_get(reply.parameters, "killWithinMs");
                if (kill && (!json_is_integer(kill) || json_integer_value(kill) < 0))
                        return -EBADMSG;
                ev->type = BROKER_EVENT_HELD;
                ev->fence_in_ms = (uint64_t) json_integer_value(fence);
                ev->kill_within_ms = kill ? (uint64_t) json_integer_value(kill) : UINT64_MAX;
                return ev->type;
        }
        if (c->state == CLIENT_HOLDING && !continues && (streq(state, "released") || streq(state, "revoked"))) {
                c->state = CLIENT_IDLE;
                c->held_lease_id = mfree(c->held_lease_id);
                ev->type = streq(state, "released") ? BROKER_EVENT_RELEASED : BROKER_EVENT_REVOKED;
                return ev->type;
        }
        return -EBADMSG;
}

/* Whether msg is the reply to broker_release_start()'s Release, which the broker sends after the Acquire's
 * end; while the lease lasts (its command still runs) it is the one message without a state. Its error,
 * if any, is kept for broker_client_error_name(): the lease's end is what the caller waits for. Returns 1
 * when it was (and takes it), 0 when it belongs to the Acquire, or a negative errno. */
static int client_take_release_reply(BrokerClient *c, const VarlinkReplyMessage *msg) {
        VarlinkReply reply = varlink_reply_message_reply(msg);
        int r;

        if (c->state == CLIENT_HOLDING && !reply.error && json_string_member(reply.parameters, "state"))
                return 0;
        if (reply.flags & VARLINK_REPLY_CONTINUES)
                return -EBADMSG;
        c->release_pending = false;
        if (reply.error) {
                r = client_error_set(c, reply.error, reply.parameters);
                if (r < 0)
                        return r;
        }
        return 1;
}

static void event_store(BrokerEvent *ret, const BrokerEvent *ev) {
        size_t size = ret->size;
        memcpy(ret, ev, MIN(size, sizeof(BrokerEvent)));
        if (size > sizeof(BrokerEvent))
                memset((uint8_t *) ret + sizeof(BrokerEvent), 0, size - sizeof(BrokerEvent));
        ret->size = size;
}

_public_ int broker_client_process(BrokerClient *c, BrokerEvent *ret) {
        BrokerEvent ev = { .size = sizeof(BrokerEvent), .type = BROKER_EVENT_NONE };
        int r;

        assert_return(c, -EINVAL);
        assert_return(ret, -EINVAL);
        assert_return(ret->size >= EVENT_SIZE_V1, -EINVAL);

        varlink_reply_message_done(&c->current);
        if (c->state == CLIENT_BROKEN)
                return -ENOTCONN;

        if (varlink_stream_pending_output(&c->stream) > 0) {
                r = varlink_stream_flush(&c->stream);
                if (r < 0 && r != -EAGAIN)
                        return client_break(c, r);
        }

        for (;;) {
                /* Read as a reply straight away: the envelope is never built as a tree. */
                _cleanup_(varlink_reply_message_done) VarlinkReplyMessage msg = c->deferred;
                c->deferred = VARLINK_REPLY_MESSAGE_INIT;
                r = msg.parameters ? 1 : varlink_stream_next_reply(&c->stream, &msg);
                if (r < 0)
                        return client_break(c, r == -EMSGSIZE || r == -ENOMEM ? r : -EBADMSG);
                if (r > 0 && c->release_pending) {
                        int taken = client_take_release_reply(c, &msg);
                        if (taken < 0)
                                return client_break(c, taken);
                        if (taken > 0)
                                continue;
                }
                if (r > 0) {
                        if (c->state == CLIENT_IDLE)
                                return client_break(c, -EBADMSG); /* nothing was asked */
                        r = client_handle_message(c, &msg, &ev);
                        if (r < 0)
                                return client_break(c, r);
                        if (r == BROKER_EVENT_NONE)
                                continue; /* taken without an event to report */
                        c->current = msg; /* the event's strings point into it */
                        msg = VARLINK_REPLY_MESSAGE_INIT;
                        event_store(ret, &ev);
                        return ev.type;
                }

                /* The last read emptied the socket: poll() first, rather than a read that says EAGAIN. */
                if (c->stream.drained) {
                        c->stream.drained = false;
                        event_store(ret, &ev);
                        return BROKER_EVENT_NONE;
                }
                ssize_t n = varlink_stream_read(&c->stream);
                if (n == -EAGAIN) {
                        event_store(ret, &ev);
                        return BROKER_EVENT_NONE;
                }
                if (n == -ENOBUFS)
                        return client_break(c, -EMSGSIZE);
                if (n <= 0)
                        return client_break(c, n == 0 ? -ECONNRESET : (int) n);
        }
}

/* Waits for the events poll() should wait for; EINTR is the caller's signal handler's business, and
 * the wait resumes after it. */
static int fd_wait(int fd, short events) {
        struct pollfd p = { .fd = fd, .events = events };
        for (;;) {
                if (poll(&p, 1, -1) >= 0)
                        return 0;
                if (errno != EINTR)
                        return negative_errno();
        }
}

_public_ int broker_acquire(BrokerClient *c, const BrokerAcquireOptions *options, BrokerLease **ret) {
        BrokerAcquireOptions o;
        int r;

        assert_return(c, -EINVAL);
        assert_return(options, -EINVAL);
        assert_return(ret, -EINVAL);

        r = options_copy(options, &o);
        if (r < 0)
                return r;
        r = broker_acquire_start(c, &o);
        if (r < 0)
                return r;

        /* The answer cannot be there yet: wait before the first read rather than after a read that fails. */
        for (bool wait = true;; wait = false) {
                BrokerEvent ev = BROKER_EVENT_INIT;
                if (wait) {
                        r = fd_wait(c->fd, (short) broker_client_get_events(c));
                        if (r < 0)
                                return r;
                }
                r = broker_client_process(c, &ev);
                if (r < 0)
                        return r;
                switch (ev.type) {
                case BROKER_EVENT_NONE:
                        r = fd_wait(c->fd, (short) broker_client_get_events(c));
                        if (r < 0)
                                return r;
                        break;
                case BROKER_EVENT_QUEUED:
                        if (o.on_position)
                                o.on_position(&ev.position, o.userdata);
                        break;
                case BROKER_EVENT_GRANTED:
                        *ret = ev.lease;
                        return 0;
                case BROKER_EVENT_REFUSED:
                        return ev.refusal;
                default:
                        return -EBADMSG; /* the lease cannot end before it was granted */
                }
        }
}

/* ---- one-reply calls ---- */

/* Sends a call and waits for its one reply, on a blocking or non-blocking stream alike. Returns 0 and
 * the message, or a negative errno (-ECONNRESET for EOF). */
static int stream_call_wait(VarlinkStream *s, const char *method, json_t *parameters, VarlinkReplyMessage *ret) {
        int r;

        r = varlink_stream_call(s, method, parameters, 0);
        if (r < 0)
                return r;
        while ((r = varlink_stream_flush(s)) == -EAGAIN) {
                r = fd_wait(s->fd, POLLOUT);
                if (r < 0)
                        return r;
        }
        if (r < 0)
                return r == -EPIPE ? -ECONNRESET : r;

        for (;;) {
                r = varlink_stream_next_reply(s, ret);
                if (r < 0)
                        return r == -EMSGSIZE || r == -ENOMEM ? r : -EBADMSG;
                if (r > 0)
                        return 0;
                ssize_t n = varlink_stream_read(s);
                if (n == -EAGAIN) {
                        r = fd_wait(s->fd, POLLIN);
                        if (r < 0)
                                return r;
                        continue;
                }
                if (n == -ENOBUFS)
                        return -EMSGSIZE;
                if (n == 0)
                        return -ECONNRESET;
                if (n < 0)
                        return (int) n;
        }
}

_public_ int broker_call(BrokerClient *c, const char *method, const char *parameters_json, char **ret_reply_json) {
        _cleanup_free_ char *qualified = NULL;
        _cleanup_(json_decrefp) json_t *parameters = NULL;
        _cleanup_(varlink_reply_message_done) VarlinkReplyMessage msg = VARLINK_REPLY_MESSAGE_INIT;
        _cleanup_close_ int fd = -EBADF;
        VarlinkStream temporary, *s;
        VarlinkReply reply;
        int r;

        assert_return(c, -EINVAL);
        assert_return(method, -EINVAL);

        if (!strchr(method, '.')) {
                if (asprintf(&qualified, INTERFACE ".%s", method) < 0)
                        return -ENOMEM;
                method = qualified;
        }
        if (!varlink_qualified_name_valid(method))
                return -EINVAL;
        if (parameters_json) {
                r = json_parse_object(parameters_json, strlen(parameters_json), &parameters);
                if (r < 0)
                        return r == -ENOMEM ? r : -EINVAL;
        }

        client_error_reset(c);
        varlink_reply_message_done(&c->current);
        bool own = c->state == CLIENT_IDLE && !c->release_pending && varlink_stream_pending_input(&c->stream) == 0;
        if (own)
                s = &c->stream;
        else {
                /* Behind an open Acquire the call would be answered only after the lease ends. */
                r = socket_connect(c->socket_path, &fd);
                if (r < 0)
                        return r;
                varlink_stream_init(&temporary, fd, VARLINK_REPLY_MAX_DEFAULT, 0);
                s = &temporary;
        }
        r = stream_call_wait(s, method, parameters, &msg);
        if (!own)
                varlink_stream_done(&temporary);
        if (r < 0)
                return own ? client_break(c, r) : r;

        reply = varlink_reply_message_reply(&msg);
        if (reply.flags & VARLINK_REPLY_CONTINUES)
                return own ? client_break(c, -EBADMSG) : -EBADMSG;
        if (reply.error)
                return client_error_set(c, reply.error, reply.parameters);
        if (ret_reply_json) {
                r = json_format(reply.parameters, ret_reply_json, NULL);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Releases the lease this connection holds over the connection itself: the broker lets a Release of its own
 * lease overtake the open Acquire, answers the Acquire with "released" (kept for the next
 * broker_client_process(), as a release from elsewhere would be) and then the Release. This saves a
 * connection set up and torn down per release, on both sides. */
static int client_release_own(BrokerClient *c, const JsonText *parameters) {
        _cleanup_(varlink_reply_message_done) VarlinkReplyMessage msg = VARLINK_REPLY_MESSAGE_INIT;
        VarlinkReply reply;
        int r;

        client_error_reset(c);
        varlink_reply_message_done(&c->current);
        r = varlink_stream_call_text(&c->stream, INTERFACE ".Release", parameters->data, parameters->size, 0, NULL, 0);
        if (r < 0)
                return r;
        while ((r = varlink_stream_flush(&c->stream)) == -EAGAIN) {
                r = fd_wait(c->fd, POLLOUT);
                if (r < 0)
                        return r;
        }
        if (r < 0)
                return client_break(c, r);

        for (bool wait = true;;) {
                r = varlink_stream_next_reply(&c->stream, &msg);
                if (r < 0)
                        return client_break(c, r == -EMSGSIZE || r == -ENOMEM ? r : -EBADMSG);
                if (r == 0) {
                        if (wait) { /* the replies cannot be there yet: no read that fails first */
                                wait = false;
                                r = fd_wait(c->fd, POLLIN);
                                if (r < 0)
                                        return r;
                        }
                        ssize_t n = varlink_stream_read(&c->stream);
                        if (n == -EAGAIN) {
                                r = fd_wait(c->fd, POLLIN);
                                if (r < 0)
                                        return r;
                                continue;
                        }
                        if (n == -ENOBUFS)
                                return client_break(c, -EMSGSIZE);
                        if (n <= 0)
                                return client_break(c, n == 0 ? -ECONNRESET : (int) n);
                        continue;
                }
                reply = varlink_reply_message_reply(&msg);
                if (!c->deferred.parameters && !reply.error && !(reply.flags & VARLINK_REPLY_CONTINUES)) {
                        const char *state = json_string_member(reply.parameters, "state");
                        if (state && (streq(state, "released") || streq(state, "revoked"))) {
                                /* The Acquire's end: first, as the broker orders them. */
                                c->deferred = msg;
                                msg = VARLINK_REPLY_MESSAGE_INIT;
                                continue;
                        }
                }
                break; /* the Release's reply */
        }
        if (!c->deferred.parameters || (reply.flags & VARLINK_REPLY_CONTINUES))
                return client_break(c, -EBADMSG);
        if (reply.error)
                return client_error_set(c, reply.error, reply.parameters);
        return 0;
}

/* A Release's parameters: the lease, and the command's exit status when it has one (>= 0). */
static int release_parameters(const char *lease_id, int exit_status, JsonText *t) {
        json_text_open(t, '{');
        json_text_key(t, "lease");
        json_text_string(t, lease_id);
        if (exit_status >= 0) {
                json_text_key(t, "exitStatus");
                json_text_integer(t, exit_status);
        }
        json_text_close(t, '}');
        return json_text_result(t); /* -EINVAL: an id that is not UTF-8 */
}

static int client_release(BrokerClient *c, const char *lease_id, int exit_status) {
        int r;

        assert_return(c, -EINVAL);
        assert_return(lease_id && *lease_id, -EINVAL);
        assert_return(exit_status >= -1 && exit_status <= 255, -EINVAL);

        _cleanup_(json_text_done) JsonText p; /* after the checks: cleaned up only once initialized */
        json_text_init(&p);
        r = release_parameters(lease_id, exit_status, &p);
        if (r < 0)
                return r;
        if (c->state == CLIENT_HOLDING && c->held_lease_id && streq(c->held_lease_id, lease_id) && !c->deferred.parameters &&
            !c->release_pending && varlink_stream_pending_input(&c->stream) == 0)
                return client_release_own(c, &p);
        _cleanup_free_ char *text = strndup(p.data, p.size);
        if (!text)
                return -ENOMEM;
        return broker_call(c, INTERFACE ".Release", text, NULL);
}

_public_ int broker_release(BrokerClient *c, const char *lease_id) {
        return client_release(c, lease_id, -1);
}

_public_ int broker_release_exit(BrokerClient *c, const char *lease_id, int exit_status) {
        assert_return(exit_status >= 0 && exit_status <= 255, -EINVAL);
        return client_release(c, lease_id, exit_status);
}

static int client_release_start(BrokerClient *c, int exit_status) {
        int r;

        assert_return(c, -EINVAL);
        assert_return(exit_status >= -1 && exit_status <= 255, -EINVAL);

        _cleanup_(json_text_done) JsonText p; /* after the checks: cleaned up only once initialized */
        json_text_init(&p);

        if (c->state == CLIENT_BROKEN)
                return -ENOTCONN;
        if (c->state != CLIENT_HOLDING || !c->held_lease_id)
                return -ESRCH;
        if (c->release_pending)
                return -EALREADY;
        r = release_parameters(c->held_lease_id, exit_status, &p);
        if (r < 0)
                return r;

        client_error_reset(c);
        r = varlink_stream_call_text(&c->stream, INTERFACE ".Release", p.data, p.size, 0, NULL, 0);
        if (r < 0)
                return r;
        r = varlink_stream_flush(&c->stream);
        if (r < 0 && r != -EAGAIN) /* EAGAIN: the rest goes out from broker_client_process() */
                return client_break(c, r);
        c->release_pending = true;
        return 0;
}

_public_ int broker_release_start(BrokerClient *c) {
        return client_release_start(c, -1);
}

_public_ int broker_release_exit_start(BrokerClient *c, int exit_status) {
        assert_return(exit_status >= 0 && exit_status <= 255, -EINVAL);
        return client_release_start(c, exit_status);
}
