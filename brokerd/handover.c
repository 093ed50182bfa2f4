/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "fs-util.h"
#include "handover.h"
#include "json.h"
#include "macro.h"
#include "selector.h"
#include "strv.h"

/* SCM_MAX_FD: the kernel takes at most this many fds with one message. */
#define HANDOVER_FDS_PER_MESSAGE 253
/* A connection's buffers in the state: a message (64 KiB by default, max-message-size ≤ 16 MiB) and the
 * output a stop could not flush (capped by max-output-per-connection). Base64: 4/3 of that. */
#define HANDOVER_BUFFER_TEXT_MAX ((size_t) 128 << 20)
#define HANDOVER_CONNECTIONS_MAX ((size_t) 1 << 20)
#define HANDOVER_POOLS_MAX ((size_t) 1 << 16)
/* A lane's labels= and also= as one text (engine_request_lane_rules()): terms and pools, a few dozen bytes each. */
#define HANDOVER_LANE_RULES_MAX ((size_t) 1 << 20)
/* Monotonic µs: what a boot can reach (a century) and no more: a larger value is damage. */
#define HANDOVER_USEC_MAX ((int64_t) 100 * 365 * 24 * 3600 * 1000000LL)

/* ---- base64 (RFC 4648, with padding): the buffers are bytes, not UTF-8 ---- */

static const char b64_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *base64_encode(const uint8_t *p, size_t n) {
        char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
        if (!out)
                return NULL;
        for (size_t i = 0; i < n; i += 3) {
                uint32_t v = (uint32_t) p[i] << 16 | (i + 1 < n ? (uint32_t) p[i + 1] << 8 : 0) |
                             (i + 2 < n ? p[i + 2] : 0);
                *o++ = b64_alphabet[v >> 18 & 63];
                *o++ = b64_alphabet[v >> 12 & 63];
                *o++ = i + 1 < n ? b64_alphabet[v >> 6 & 63] : '=';
                *o++ = i + 2 < n ? b64_alphabet[v & 63] : '=';
        }
        *o = 0;
        return out;
}

static int base64_value(char c) {
        const char *p = c ? strchr(b64_alphabet, c) : NULL;
        return p ? (int) (p - b64_alphabet) : -1;
}

static int base64_decode(const char *s, void **ret, size_t *ret_size) {
        size_t len = strlen(s);
        if (len % 4 != 0)
                return -EBADMSG;
        _cleanup_free_ uint8_t *out = malloc(len / 4 * 3 + 1);
        if (!out)
                return -ENOMEM;
        size_t n = 0;
        for (size_t i = 0; i < len; i += 4) {
                int v[4];
                for (int k = 0; k < 4; k++)
                        v[k] = base64_value(s[i + k]);
                bool last = i + 4 == len;
                /* Padding only at the very end, and only as "x=" or "=="; the bits it hides must be zero. */
                if (v[0] < 0 || v[1] < 0)
                        return -EBADMSG;
                if (v[2] < 0 && (!last || s[i + 2] != '=' || s[i + 3] != '=' || (v[1] & 15)))
                        return -EBADMSG;
                if (v[3] < 0 && (!last || s[i + 3] != '=' || (v[2] >= 0 && (v[2] & 3))))
                        return -EBADMSG;
                out[n++] = (uint8_t) (v[0] << 2 | v[1] >> 4);
                if (v[2] >= 0)
                        out[n++] = (uint8_t) ((v[1] & 15) << 4 | v[2] >> 2);
                if (v[2] >= 0 && v[3] >= 0)
                        out[n++] = (uint8_t) ((v[2] & 3) << 6 | v[3]);
        }
        *ret = TAKE_PTR(out);
        *ret_size = n;
        return 0;
}

/* ---- the entries ---- */

void handover_acquire_done(HandoverAcquire *a) {
        free(a->lane);
        free(a->job);
        strv_free(a->labels);
        free(a->member);
        free(a->pool);
        free(a->remote_id);
        free(a->lane_rules);
        free(a->lease);
        *a = (HandoverAcquire) {};
}

void handover_connection_done(HandoverConnection *c) {
        free(c->input);
        free(c->output);
        handover_acquire_done(&c->acquire);
        safe_close(c->fd);
        *c = (HandoverConnection) { .fd = -EBADF };
}

void handover_done(Handover *h) {
        for (size_t i = 0; i < h->n_connections; i++)
                handover_connection_done(&h->connections[i]);
        free(h->connections);
        for (size_t i = 0; i < h->n_pools; i++)
                free(h->pools[i].name);
        free(h->pools);
        *h = (Handover) {};
}

int handover_add_connection(Handover *h, HandoverConnection **ret) {
        if (h->n_connections == h->allocated) {
                size_t n = MAX(h->allocated * 2, (size_t) 16);
                HandoverConnection *a = reallocarray(h->connections, n, sizeof(HandoverConnection));
                if (!a)
                        return -ENOMEM;
                h->connections = a;
                h->allocated = n;
        }
        HandoverConnection *c = &h->connections[h->n_connections++];
        *c = (HandoverConnection) { .fd = -EBADF };
        *ret = c;
        return 0;
}

int handover_add_pool(Handover *h, const char *name, usec_t last_fast) {
        char *n = strdup(name);
        HandoverPool *a = n ? reallocarray(h->pools, h->n_pools + 1, sizeof(HandoverPool)) : NULL;
        if (!a) {
                free(n);
                return -ENOMEM;
        }
        h->pools = a;
        h->pools[h->n_pools++] = (HandoverPool) { .name = n, .last_fast = last_fast };
        return 0;
}

/* ---- format ---- */

/* queue_state_to_string() names no state for QUEUE_STATE_NONE. */
static const char *queue_state_name(QueueState s) {
        return queue_state_to_string(s) ?: "none";
}

/* The text is written as it goes, not built as a jansson tree: at 10,000 connections the tree's allocations
 * were 0.2-0.3 s of a restart's 1 s (perf: malloc). The parse reads it with the wire's parser. */
static void put_string(FILE *f, const char *s) {
        fputc('"', f);
        for (const unsigned char *p = (const unsigned char *) s; *p; p++)
                if (*p == '"' || *p == '\\')
                        fprintf(f, "\\%c", *p);
                else if (*p < 0x20 || *p == 0x7f)
                        fprintf(f, "\\u%04x", *p);
                else
                        fputc(*p, f);
        fputc('"', f);
}

/* ,"key":"value" — nothing for NULL. */
static void put_string_field(FILE *f, const char *key, const char *value) {
        if (!value)
                return;
        fprintf(f, ",\"%s\":", key);
        put_string(f, value);
}

/* ,"key":N — nothing for USEC_INFINITY. */
static void put_usec_field(FILE *f, const char *key, usec_t v) {
        if (v != USEC_INFINITY)
                fprintf(f, ",\"%s\":%" PRIu64, key, (uint64_t) v);
}

static int put_buffer_field(FILE *f, const char *key, const void *data, size_t size) {
        if (size == 0)
                return 0;
        _cleanup_free_ char *text = base64_encode(data, size);
        if (!text)
                return -ENOMEM;
        fprintf(f, ",\"%s\":\"%s\"", key, text);
        return 0;
}

static void put_acquire(FILE *f, const HandoverAcquire *a) {
        fputs(",\"acquire\":{\"lane\":", f);
        put_string(f, a->lane);
        put_string_field(f, "job", a->job);
        fprintf(f, ",\"slots\":%u,\"more\":%s,\"fence\":%s,\"lastPosition\":%" PRIu64 ",\"lastQueued\":%" PRIu64,
                a->slots, a->more ? "true" : "false", a->fence ? "true" : "false", a->last_position, a->last_queued);
        put_usec_field(f, "maxHold", a->max_hold);
        put_usec_field(f, "maxWait", a->max_wait);
        if (a->labels) {
                fputs(",\"labels\":[", f);
                for (size_t i = 0; a->labels[i]; i++) {
                        if (i > 0)
                                fputc(',', f);
                        put_string(f, a->labels[i]);
                }
                fputc(']', f);
        }
        put_string_field(f, "member", a->member);
        if (a->has_command)
                fprintf(f, ",\"command\":{\"pid\":%d,\"start\":%" PRIu64 "}", (int) a->command_pid, a->command_start);
        if (a->lease)
                put_string_field(f, "lease", a->lease);
        else if (a->pool) {
                fputs(",\"waiting\":{\"pool\":", f);
                put_string(f, a->pool);
                fprintf(f, ",\"arrival\":%" PRIu64 ",\"state\":\"%s\",\"idle\":%" PRIu64 ",\"position\":%" PRIu64,
                        (uint64_t) a->arrival, queue_state_name(a->state), (uint64_t) a->idle, a->position);
                put_usec_field(f, "budget", a->budget);
                put_string_field(f, "remoteId", a->remote_id);
                put_string_field(f, "laneRules", a->lane_rules);
                fputc('}', f);
        }
        fputc('}', f);
}

int handover_format(const Handover *h, const char *boot_id, pid_t pid, usec_t now, char **ret, size_t *ret_size) {
        char *text = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&text, &size);
        if (!f)
                return -ENOMEM;
        int r = 0;
        fprintf(f, "{\"format\":\"" HANDOVER_FORMAT "\",\"version\":%d,\"boot\":", HANDOVER_VERSION);
        put_string(f, boot_id);
        fprintf(f, ",\"pid\":%d,\"at\":%" PRIu64 ",\"pools\":[", (int) pid, (uint64_t) now);
        for (size_t i = 0; i < h->n_pools; i++) {
                fputs(i > 0 ? ",{\"name\":" : "{\"name\":", f);
                put_string(f, h->pools[i].name);
                fprintf(f, ",\"lastFast\":%" PRIu64 "}", (uint64_t) h->pools[i].last_fast);
        }
        fputs("],\"connections\":[", f);
        for (size_t i = 0; r >= 0 && i < h->n_connections; i++) {
                const HandoverConnection *c = &h->connections[i];
                fprintf(f, "%s{\"ino\":%" PRIu64 ",\"dev\":%" PRIu64, i > 0 ? "," : "", c->ino, c->dev);
                if (c->peer_since > 0)
                        fprintf(f, ",\"peerSince\":%" PRIu64, (uint64_t) c->peer_since);
                r = put_buffer_field(f, "input", c->input, c->n_input);
                if (r >= 0)
                        r = put_buffer_field(f, "output", c->output, c->n_output);
                if (c->has_acquire)
                        put_acquire(f, &c->acquire);
                fputc('}', f);
        }
        fputs("]}", f);
        if (fclose(f) != 0 && r >= 0)
                r = -ENOMEM;
        if (r < 0) {
                free(text);
                return r;
        }
        *ret = text;
        *ret_size = size;
        return 0;
}

/* ---- parse ---- */

static bool boot_id_valid(const char *s) {
        if (strlen(s) != 32)
                return false;
        for (const char *p = s; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

static int parse_buffer(const char *text, void **ret, size_t *ret_size) {
        if (!text) {
                *ret = NULL;
                *ret_size = 0;
                return 0;
        }
        return base64_decode(text, ret, ret_size);
}

static int parse_waiting(json_t *w, usec_t now, HandoverAcquire *a) {
        const char *pool = NULL, *state = NULL, *remote_id = NULL, *lane_rules = NULL;
        int64_t arrival = 0, idle = 0, budget = -1, position = 0;
        const JsonField table[] = {
                { "pool", JSON_FIELD_STRING, JSON_MANDATORY, &pool, .max_length = 256 },
                { "arrival", JSON_FIELD_INT64, JSON_MANDATORY, &arrival, 0, HANDOVER_USEC_MAX },
                { "state", JSON_FIELD_STRING, JSON_MANDATORY, &state, .max_length = 32 },
                { "idle", JSON_FIELD_INT64, JSON_MANDATORY, &idle, 0, HANDOVER_USEC_MAX },
                { "budget", JSON_FIELD_INT64, 0, &budget, 0, HANDOVER_USEC_MAX },
                { "position", JSON_FIELD_INT64, JSON_MANDATORY, &position, 0, INT64_MAX },
                { "remoteId", JSON_FIELD_STRING, 0, &remote_id, .max_length = 128 },
                { "laneRules", JSON_FIELD_STRING, 0, &lane_rules, .max_length = HANDOVER_LANE_RULES_MAX },
                {},
        };
        if (json_dispatch(w, table, 0, NULL) < 0 || !*pool || (usec_t) arrival > now)
                return -EBADMSG;
        QueueState qs = QUEUE_STATE_NONE;
        for (; qs < _QUEUE_STATE_MAX; qs++)
                if (streq(state, queue_state_name(qs)))
                        break;
        if (qs == _QUEUE_STATE_MAX)
                return -EBADMSG;
        a->arrival = (usec_t) arrival;
        a->state = qs;
        a->idle = (usec_t) idle;
        a->budget = budget < 0 ? USEC_INFINITY : (usec_t) budget;
        a->position = (uint64_t) position;
        if (strdup_or_null(pool, &a->pool) < 0 || strdup_or_null(remote_id, &a->remote_id) < 0 ||
            strdup_or_null(lane_rules, &a->lane_rules) < 0)
                return -ENOMEM;
        return 0;
}

static int parse_acquire(json_t *o, usec_t now, HandoverAcquire *a) {
        const char *lane = NULL, *job = NULL, *lease = NULL, *member = NULL;
        _cleanup_(json_strv_freep) char **labels = NULL;
        unsigned slots = 0;
        bool more = false, fence = false;
        int64_t max_hold = -1, max_wait = -1, last_position = 0, last_queued = 0;
        json_t *command = NULL, *waiting = NULL;
        const JsonField table[] = {
                { "lane", JSON_FIELD_STRING, JSON_MANDATORY, &lane, .max_length = 64 },
                { "job", JSON_FIELD_STRING, 0, &job, .max_length = 1024 },
                { "slots", JSON_FIELD_UNSIGNED, JSON_MANDATORY, &slots, 1, 1 << 20 },
                { "more", JSON_FIELD_BOOL, JSON_MANDATORY, &more },
                { "fence", JSON_FIELD_BOOL, JSON_MANDATORY, &fence },
                { "maxHold", JSON_FIELD_INT64, 0, &max_hold, 1, HANDOVER_USEC_MAX },
                { "maxWait", JSON_FIELD_INT64, 0, &max_wait, 1, HANDOVER_USEC_MAX },
                { "lastPosition", JSON_FIELD_INT64, JSON_MANDATORY, &last_position, 0, INT64_MAX },
                { "lastQueued", JSON_FIELD_INT64, JSON_MANDATORY, &last_queued, 0, INT64_MAX },
                { "command", JSON_FIELD_OBJECT, 0, &command },
                { "waiting", JSON_FIELD_OBJECT, 0, &waiting },
                { "lease", JSON_FIELD_STRING, 0, &lease, .max_length = 64 },
                { "labels", JSON_FIELD_STRV, 0, &labels, .max_length = SELECTOR_TERMS_MAX },
                { "member", JSON_FIELD_STRING, 0, &member, .max_length = 64 },
                {},
        };
        if (json_dispatch(o, table, 0, NULL) < 0 || !*lane || (!waiting == !lease))
                return -EBADMSG; /* waiting or holding: one of the two */
        for (size_t i = 0; labels && labels[i]; i++)
                if (!selector_term_is_valid(labels[i]))
                        return -EBADMSG;
        if (member && !conf_name_is_valid(member))
                return -EBADMSG;
        if (command) {
                int64_t pid = 0, start = 0;
                const JsonField ct[] = {
                        { "pid", JSON_FIELD_INT64, JSON_MANDATORY, &pid, 1, INT32_MAX },
                        { "start", JSON_FIELD_INT64, JSON_MANDATORY, &start, 0, INT64_MAX },
                        {},
                };
                if (json_dispatch(command, ct, 0, NULL) < 0)
                        return -EBADMSG;
                a->has_command = true;
                a->command_pid = (pid_t) pid;
                a->command_start = (uint64_t) start;
        }
        a->slots = slots;
        a->budget = USEC_INFINITY; /* a holder's: it waits no more */
        a->more = more;
        a->fence = fence;
        a->max_hold = max_hold < 0 ? USEC_INFINITY : (usec_t) max_hold;
        a->max_wait = max_wait < 0 ? USEC_INFINITY : (usec_t) max_wait;
        a->last_position = (uint64_t) last_position;
        a->last_queued = (uint64_t) last_queued;
        if (strdup_or_null(lane, &a->lane) < 0 || strdup_or_null(job, &a->job) < 0 ||
            strdup_or_null(lease, &a->lease) < 0 || strdup_or_null(member, &a->member) < 0)
                return -ENOMEM;
        a->labels = labels && labels[0] ? strv_copy(labels) : NULL;
        if (labels && labels[0] && !a->labels)
                return -ENOMEM;
        return waiting ? parse_waiting(waiting, now, a) : 0;
}

static int parse_connection(json_t *o, usec_t now, HandoverConnection *c) {
        uint64_t ino = 0, dev = 0, peer_since = 0;
        const char *input = NULL, *output = NULL;
        json_t *acquire = NULL;
        const JsonField table[] = {
                { "ino", JSON_FIELD_UINT64, JSON_MANDATORY, &ino },
                { "dev", JSON_FIELD_UINT64, JSON_MANDATORY, &dev },
                { "peerSince", JSON_FIELD_UINT64, 0, &peer_since },
                { "input", JSON_FIELD_STRING, 0, &input, .max_length = HANDOVER_BUFFER_TEXT_MAX },
                { "output", JSON_FIELD_STRING, 0, &output, .max_length = HANDOVER_BUFFER_TEXT_MAX },
                { "acquire", JSON_FIELD_OBJECT, 0, &acquire },
                {},
        };
        if (json_dispatch(o, table, 0, NULL) < 0)
                return -EBADMSG;
        c->ino = ino;
        c->dev = dev;
        c->peer_since = peer_since;
        int r = parse_buffer(input, &c->input, &c->n_input);
        if (r < 0)
                return r;
        r = parse_buffer(output, &c->output, &c->n_output);
        if (r < 0)
                return r;
        if (acquire) {
                c->has_acquire = true;
                r = parse_acquire(acquire, now, &c->acquire);
        }
        return r;
}

int handover_parse(const void *data, size_t size, const char *boot_id, usec_t now, Handover *ret) {
        _cleanup_(json_decrefp) json_t *root = NULL;
        _cleanup_(handover_done) Handover h = {};
        const char *format = NULL, *boot = NULL;
        unsigned version = 0;
        int64_t pid = 0, at = 0;
        json_t *pools = NULL, *conns = NULL;

        if (size > HANDOVER_STATE_MAX)
                return -EBADMSG;
        int r = json_parse_object(data, size, &root);
        if (r < 0)
                return r == -ENOMEM ? r : -EBADMSG;
        /* Format and version first, alone: a newer brokerd may have added keys that this one must not judge. */
        const JsonField head[] = {
                { "format", JSON_FIELD_STRING, JSON_MANDATORY, &format, .max_length = 64 },
                { "version", JSON_FIELD_UNSIGNED, JSON_MANDATORY, &version },
                {},
        };
        if (json_dispatch(root, head, JSON_DISPATCH_ALLOW_UNKNOWN, NULL) < 0)
                return -EBADMSG;
        if (!streq(format, HANDOVER_FORMAT) || version < HANDOVER_VERSION_OLDEST || version > HANDOVER_VERSION)
                return -EPROTONOSUPPORT;
        const JsonField table[] = {
                { "format", JSON_FIELD_STRING, JSON_MANDATORY, &format, .max_length = 64 },
                { "version", JSON_FIELD_UNSIGNED, JSON_MANDATORY, &version },
                { "boot", JSON_FIELD_STRING, JSON_MANDATORY, &boot, .max_length = 32 },
                { "pid", JSON_FIELD_INT64, JSON_MANDATORY, &pid, 1, INT32_MAX },
                { "at", JSON_FIELD_INT64, JSON_MANDATORY, &at, 0, HANDOVER_USEC_MAX },
                { "pools", JSON_FIELD_ARRAY, JSON_MANDATORY, &pools, .max_length = HANDOVER_POOLS_MAX },
                { "connections", JSON_FIELD_ARRAY, JSON_MANDATORY, &conns, .max_length = HANDOVER_CONNECTIONS_MAX },
                {},
        };
        if (json_dispatch(root, table, 0, NULL) < 0 || !boot_id_valid(boot))
                return -EBADMSG;
        /* Monotonic instants mean something on the boot that took them only. */
        if (!streq(boot, boot_id) || (usec_t) at > now)
                return -ESTALE;

        size_t i;
        json_t *v;
        json_array_foreach(pools, i, v) {
                const char *name = NULL;
                int64_t last_fast = 0;
                const JsonField pt[] = {
                        { "name", JSON_FIELD_STRING, JSON_MANDATORY, &name, .max_length = 256 },
                        { "lastFast", JSON_FIELD_INT64, JSON_MANDATORY, &last_fast, 0, HANDOVER_USEC_MAX },
                        {},
                };
                if (json_dispatch(v, pt, 0, NULL) < 0 || (usec_t) last_fast > now)
                        return -EBADMSG;
                r = handover_add_pool(&h, name, (usec_t) last_fast);
                if (r < 0)
                        return r;
        }
        json_array_foreach(conns, i, v) {
                HandoverConnection *c;
                r = handover_add_connection(&h, &c);
                if (r < 0)
                        return r;
                r = parse_connection(v, now, c);
                if (r < 0)
                        return r;
        }
        *ret = h;
        h = (Handover) {};
        return 0;
}

int handover_boot_id(char ret[static 33]) {
        _cleanup_close_ int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return negative_errno();
        char buf[64];
        ssize_t n = read(fd, buf, sizeof buf - 1);
        if (n < 0)
                return negative_errno();
        size_t k = 0;
        for (ssize_t i = 0; i < n && k < 32; i++)
                if (buf[i] != '-' && buf[i] != '\n')
                        ret[k++] = buf[i];
        ret[k] = 0;
        return boot_id_valid(ret) ? 0 : -EIO;
}

/* ---- the store ---- */

int handover_send(const Handover *h, usec_t now) {
        const char *e = getenv("NOTIFY_SOCKET");
        if (!e || !*e)
                return -ENXIO;
        char boot[33];
        int r = handover_boot_id(boot);
        if (r < 0)
                return r;
        _cleanup_free_ char *text = NULL;
        size_t size;
        r = handover_format(h, boot, getpid(), now, &text, &size);
        if (r < 0)
                return r;
        _cleanup_close_ int fd = memfd_create("slotbroker-handover", MFD_CLOEXEC);
        if (fd < 0)
                return negative_errno();
        r = fd_write_all(fd, text, size);
        if (r < 0)
                return r;
        /* The state first: it must be in the store for the sockets to mean anything, and a store that is full
         * refuses what comes last. */
        r = sd_pid_notify_with_fds(0, false, "FDSTORE=1\nFDNAME=" HANDOVER_FDNAME_STATE, &fd, 1);
        if (r <= 0)
                return r < 0 ? r : -ENXIO;

        int fds[HANDOVER_FDS_PER_MESSAGE];
        size_t n = 0;
        for (size_t i = 0; i <= h->n_connections; i++) {
                if (i < h->n_connections && h->connections[i].fd >= 0)
                        fds[n++] = h->connections[i].fd;
                if (n > 0 && (n == ELEMENTSOF(fds) || i == h->n_connections)) {
                        r = sd_pid_notify_with_fds(0, false, "FDSTORE=1\nFDNAME=" HANDOVER_FDNAME_CONNECTION, fds,
                                                   (unsigned) n);
                        if (r <= 0)
                                return r < 0 ? r : -ENXIO;
                        n = 0;
                }
        }
        return 0;
}

static int fds_append(int **a, size_t *n, int fd) {
        int *b = reallocarray(*a, *n + 1, sizeof(int));
        if (!b)
                return -ENOMEM;
        b[(*n)++] = fd;
        *a = b;
        return 0;
}

bool handover_fds_take(HandoverFds *f, const char *name, int fd) {
        bool state = streq(name, HANDOVER_FDNAME_STATE);
        if (!state && !streq(name, HANDOVER_FDNAME_CONNECTION))
                return false;
        /* Out of memory: the fd is closed (a connection's client re-queues). */
        if (fds_append(state ? &f->states : &f->connections, state ? &f->n_states : &f->n_connections, fd) < 0) {
                if (!state)
                        (void) shutdown(fd, SHUT_RDWR);
                safe_close(fd);
        }
        return true;
}

static void close_connection_fd(int fd) {
        /* The store keeps its own copy until flushed: shut down, so that the client sees the end now. */
        (void) shutdown(fd, SHUT_RDWR);
        safe_close(fd);
}

void handover_fds_done(HandoverFds *f) {
        for (size_t i = 0; i < f->n_states; i++)
                safe_close(f->states[i]);
        for (size_t i = 0; i < f->n_connections; i++)
                close_connection_fd(f->connections[i]);
        free(f->states);
        free(f->connections);
        *f = (HandoverFds) {};
}

/* Reads the state and empties it: whatever happens next, it is not read twice. */
static int state_read(int fd, void **ret, size_t *ret_size) {
        struct stat st;
        if (fstat(fd, &st) < 0)
                return negative_errno();
        if (!S_ISREG(st.st_mode) || (uint64_t) st.st_size > HANDOVER_STATE_MAX)
                return -EBADMSG;
        size_t size = (size_t) st.st_size;
        _cleanup_free_ char *buf = malloc(size + 1);
        if (!buf)
                return -ENOMEM;
        size_t got = 0;
        while (got < size) {
                ssize_t n = pread(fd, buf + got, size - got, (off_t) got);
                if (n < 0)
                        return negative_errno();
                if (n == 0)
                        break; /* cut short under us: the parse says so */
                got += (size_t) n;
        }
        if (ftruncate(fd, 0) < 0)
                return negative_errno();
        *ret = TAKE_PTR(buf);
        *ret_size = got;
        return 0;
}

static int connection_entry_cmp(const void *a, const void *b) {
        const HandoverConnection *x = a, *y = b;
        if (x->ino != y->ino)
                return x->ino < y->ino ? -1 : 1;
        return x->dev < y->dev ? -1 : x->dev > y->dev;
}

int handover_load(HandoverFds *f, usec_t now, Handover *ret, HandoverLoad *ret_load) {
        HandoverLoad load = {};
        _cleanup_(handover_done) Handover h = {};
        bool any = f->n_states + f->n_connections > 0;

        /* The last state stored is this handover's; an older one (a crash after the stop that stored it) is not. */
        for (size_t i = 0; i < f->n_states; i++) {
                _cleanup_free_ void *data = NULL;
                size_t size = 0;
                int r = state_read(f->states[i], &data, &size);
                if (i + 1 < f->n_states)
                        continue;
                if (r == -ENOMEM)
                        return r;
                if (r >= 0) {
                        char boot[33];
                        r = handover_boot_id(boot);
                        if (r >= 0)
                                r = handover_parse(data, size, boot, now, &h);
                }
                if (r == -ENOMEM)
                        return r;
                load.error = r < 0 ? r : 0;
        }
        if (f->n_states == 0 && f->n_connections > 0)
                load.error = -ENODATA;

        /* Entries by socket: sorted, each fd looked up once (qsort() and bsearch() want an array, even empty). */
        if (h.n_connections > 0)
                qsort(h.connections, h.n_connections, sizeof(HandoverConnection), connection_entry_cmp);
        for (size_t i = 0; i < f->n_connections; i++) {
                int fd = f->connections[i];
                struct stat st;
                HandoverConnection key = {}, *c = NULL;
                if (h.n_connections > 0 && fstat(fd, &st) >= 0 && S_ISSOCK(st.st_mode)) {
                        key.ino = st.st_ino;
                        key.dev = st.st_dev;
                        c = bsearch(&key, h.connections, h.n_connections, sizeof(HandoverConnection),
                                    connection_entry_cmp);
                }
                if (c && c->fd < 0) {
                        c->fd = fd;
                        load.matched++;
                } else {
                        close_connection_fd(fd);
                        load.closed++;
                }
        }
        f->connections = mfree(f->connections);
        f->n_connections = 0;
        for (size_t i = 0; i < f->n_states; i++)
                safe_close(f->states[i]);
        f->states = mfree(f->states);
        f->n_states = 0;

        /* Entries whose socket did not come back (beyond FileDescriptorStoreMax=, hung up meanwhile) go. */
        size_t k = 0;
        for (size_t i = 0; i < h.n_connections; i++)
                if (h.connections[i].fd >= 0)
                        h.connections[k++] = h.connections[i];
                else
                        handover_connection_done(&h.connections[i]);
        h.n_connections = k;

        /* systemd keeps its copies until told: flushed before anyone is served, so that a connection closed
         * here ends for its client, and a later start never finds these again. */
        if (any) {
                (void) sd_notify(false, "FDSTOREREMOVE=1\nFDNAME=" HANDOVER_FDNAME_CONNECTION);
                (void) sd_notify(false, "FDSTOREREMOVE=1\nFDNAME=" HANDOVER_FDNAME_STATE);
        }
        *ret = h;
        h = (Handover) {};
        *ret_load = load;
        return 0;
}
