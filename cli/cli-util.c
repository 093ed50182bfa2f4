/* SPDX-License-Identifier: MIT */
#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli-util.h"
#include "conf.h"

_printf_(2, 0) static void log_va(const char *prefix, const char *format, va_list ap) {
        /* One fprintf per line would interleave with the command's output less than several writes. */
        char line[4096];
        vsnprintf(line, sizeof line, format, ap);
        fprintf(stderr, "slotctl: %s%s\n", prefix, line);
}

void log_error(const char *format, ...) {
        va_list ap;
        va_start(ap, format);
        log_va("", format, ap);
        va_end(ap);
}

void log_warning(const char *format, ...) {
        va_list ap;
        va_start(ap, format);
        log_va("warning: ", format, ap);
        va_end(ap);
}

void log_notice(const char *format, ...) {
        va_list ap;
        va_start(ap, format);
        log_va("", format, ap);
        va_end(ap);
}

int log_error_errno(int error, const char *format, ...) {
        va_list ap;
        error = error < 0 ? -error : error;
        errno = error;
        va_start(ap, format);
        log_va("", format, ap);
        va_end(ap);
        return -error;
}

int log_usage(const char *verb, const char *format, ...) {
        va_list ap;
        char line[4096];
        va_start(ap, format);
        vsnprintf(line, sizeof line, format, ap);
        va_end(ap);
        fprintf(stderr, "slotctl %s: %s (see slotctl %s --help)\n", verb, line, verb);
        return -EINVAL;
}

bool cli_reason_is_valid(const char *verb, const char *reason) {
        size_t n = strlen(reason);
        if (n == 0 || n > CONF_REASON_MAX) {
                log_usage(verb, "--reason: %s (1 to %d bytes)", n == 0 ? "empty" : "too long", CONF_REASON_MAX);
                return false;
        }
        if (!conf_reason_is_valid(reason)) {
                log_usage(verb, "--reason: contains a control character or a line break (one line of text, please)");
                return false;
        }
        return true;
}

int log_usage_option(const char *verb, int opt, char *argv[]) {
        const char *option = argv[optind - 1];
        return opt == ':' ? log_usage(verb, "option '%s' needs a value", option)
                          : log_usage(verb, "unknown option '%s'", option);
}

int cli_parse_options(const char *verb, int argc, char *argv[], void (*help)(const char *verb), const CliOptions *o) {
        enum { ARG_SOCKET = 0x100, ARG_JSON };
        struct option options[16] = {
                { "socket", required_argument, NULL, ARG_SOCKET },
                { "help", no_argument, NULL, 'h' },
        };
        size_t n = 2;
        if (o->json)
                options[n++] = (struct option) { "json", no_argument, NULL, ARG_JSON };
        for (const struct option *e = o->extra; e && e->name; e++) {
                assert(n < ELEMENTSOF(options) - 1);
                options[n++] = *e;
        }
        int c;

        optind = 0;
        opterr = 0;
        while ((c = getopt_long(argc, argv, ":h", options, NULL)) >= 0)
                switch (c) {
                case ARG_SOCKET:
                        *o->socket_path = optarg;
                        break;
                case ARG_JSON:
                        *o->json = true;
                        break;
                case 'h':
                        help(verb);
                        return 0;
                case ':':
                case '?':
                        return log_usage_option(verb, c, argv);
                default:
                        if (!o->on_extra || o->on_extra(c, optarg) < 0)
                                return -EINVAL;
                }
        return 1;
}

int cli_parse_duration(const char *option, const char *s, bool allow_infinity, usec_t *ret) {
        usec_t t;
        /* A bare number counts in seconds, as in config files and timeout(1). */
        int r = timespan_parse(s, USEC_PER_SEC, &t);
        if (r < 0) {
                log_error("%s: invalid duration \"%s\" (e.g. 30s, 5min, 1h 30min%s)", option, s,
                          allow_infinity ? ", infinity" : "");
                return -EINVAL;
        }
        if (t == USEC_INFINITY && !allow_infinity) {
                log_error("%s: \"%s\" is not a finite duration", option, s);
                return -EINVAL;
        }
        *ret = t;
        return 0;
}

int cli_parse_unsigned(const char *option, const char *s, unsigned min, unsigned max, unsigned *ret) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (!*s || *end || errno != 0 || s[0] == '-' || s[0] == '+' || v < min || v > max) {
                log_error("%s: expected a number from %u to %u, got \"%s\"", option, min, max, s);
                return -EINVAL;
        }
        *ret = (unsigned) v;
        return 0;
}

static const char *getenv_nonempty(const char *name) {
        const char *e = getenv(name);
        return e && *e ? e : NULL;
}

/* Cuts s to at most max bytes without splitting a UTF-8 sequence. */
static void utf8_truncate(char *s, size_t max) {
        size_t n = strlen(s);
        if (n <= max)
                return;
        n = max;
        while (n > 0 && ((unsigned char) s[n] & 0xc0) == 0x80)
                n--; /* s[n] continues a sequence: cut before the sequence starts */
        s[n] = '\0';
}

static int32_t utf8_decode(const unsigned char *s, size_t *ret_len);

/* Makes s UTF-8, each byte that starts no sequence becoming '?': the protocol refuses anything else, and a
 * job label taken from the CI's variables is for people, not worth failing the job over. */
static void utf8_make_valid(char *s) {
        for (size_t len; *s; s += len)
                if (utf8_decode((const unsigned char *) s, &len) < 0) {
                        *s = '?';
                        len = 1;
                }
}

int cli_job_from_environment(char **ret) {
        const char *e;
        char *job = NULL;

        if ((e = getenv_nonempty("CI_JOB_URL")))
                job = strdup(e);
        else if ((e = getenv_nonempty("GITHUB_RUN_ID")) && getenv_nonempty("GITHUB_REPOSITORY")) {
                const char *server = getenv_nonempty("GITHUB_SERVER_URL") ?: "https://github.com";
                const char *name = getenv_nonempty("GITHUB_JOB");
                if (asprintf(&job, "%s/%s/actions/runs/%s%s%s", server, getenv("GITHUB_REPOSITORY"), e,
                             name ? " " : "", name ?: "") < 0)
                        return -ENOMEM;
        } else if ((e = getenv_nonempty("BUILDKITE_BUILD_URL")) || (e = getenv_nonempty("BUILD_URL")))
                job = strdup(e);
        else {
                *ret = NULL;
                return 0;
        }
        if (!job)
                return -ENOMEM;
        utf8_make_valid(job);
        utf8_truncate(job, CLI_JOB_MAX);
        *ret = job;
        return 0;
}

bool cli_errno_is_unreachable(int error) {
        switch (abs(error)) {
        case ENOENT:
        case ENOTDIR:
        case ECONNREFUSED:
        case ECONNRESET:
        case ECONNABORTED:
        case EPIPE:
        case ENOTCONN:
        case ENXIO:
        case EAGAIN: /* the listen backlog is full: no broker that will answer soon */
                return true;
        default:
                return false;
        }
}

int cli_connect(const char *socket_path, BrokerClient **ret) {
        _cleanup_free_ char *path = NULL;
        int r;

        if (!socket_path) {
                r = broker_client_default_socket_path(&path);
                if (r < 0)
                        return log_error_errno(r, "Failed to determine the broker's socket: %m");
                socket_path = path;
        }
        r = broker_client_connect(socket_path, ret);
        if (r == -EACCES || r == -EPERM)
                return log_error_errno(r, "permission denied on the broker's socket %s", socket_path);
        if (r < 0 && cli_errno_is_unreachable(r))
                return log_error_errno(r, "cannot reach the broker at %s: %m", socket_path);
        if (r < 0)
                return log_error_errno(r, "Failed to connect to the broker at %s: %m", socket_path);
        return 0;
}

int cli_exit_status_from_errno(int error) {
        if (error == -EACCES || error == -EPERM)
                return EXIT_NO_PERMISSION;
        if (cli_errno_is_unreachable(error))
                return EXIT_UNREACHABLE;
        if (error == -EINVAL)
                return EXIT_USAGE;
        return EXIT_FAILURE;
}

static const char *param_string(json_t *p, const char *key) {
        return json_string_value(json_object_get(p, key));
}

int cli_log_result(BrokerClient *c, const char *what, int result, int conflict_exit_code) {
        _cleanup_(json_decrefp) json_t *p = NULL;
        const char *text = broker_client_error_parameters(c);
        const char *name = broker_client_error_name(c) ?: "?";
        char retry[64] = "", waited[CLI_DURATION_MAX];

        if (text)
                p = json_loads(text, 0, NULL);
        if (cli_json_make_printable(p) < 0) {
                log_error("Out of memory.");
                return EXIT_FAILURE;
        }
        const char *pool = param_string(p, "pool") ?: "?";
        unsigned retry_after = broker_client_retry_after_sec(c);
        if (retry_after > 0)
                snprintf(retry, sizeof retry, "; retry after %u s", retry_after);
        json_t *w = json_object_get(p, "waitedMs");
        cli_format_duration_ms(waited, json_is_integer(w) ? (uint64_t) json_integer_value(w) : 0);

        switch (result) {
        case BROKER_REFUSED_BUSY:
                if (streq_ptr(param_string(p, "reason"), "cooldown"))
                        log_error("refused (busy): the free slots of pool %s are resting (cooldown)%s", pool, retry);
                else
                        log_error("refused (busy): pool %s is full%s", pool, retry);
                return conflict_exit_code;
        case BROKER_REFUSED_FULL:
                log_error("refused (full): the queue of pool %s is full%s", pool, retry);
                return conflict_exit_code;
        case BROKER_REFUSED_TIMEOUT:
                log_error("refused (timeout): no slot of pool %s within %s%s", pool, waited, retry);
                return conflict_exit_code;
        case BROKER_REFUSED_SHED:
                log_error("refused (shed): pool %s is saturated, shed after %s of waiting%s", pool, waited, retry);
                return conflict_exit_code;
        case BROKER_REFUSED_UNAVAILABLE: {
                const char *reason = param_string(p, "reason");
                if (streq_ptr(reason, "rate"))
                        reason = "rate (too many requests from this user or host; brokerd.conf(5) "
                                 "max-acquire-rate-per-uid=)";
                if (param_string(p, "pool"))
                        log_error("%s (unavailable): pool %s%s%s%s", streq(what, "acquire") ? "refused" : what,
                                  param_string(p, "pool"), reason ? ": " : "", reason ?: "", retry);
                else
                        log_error("%s (unavailable): %s%s", streq(what, "acquire") ? "refused" : what,
                                  reason ?: "the broker cannot serve this now", retry);
                return conflict_exit_code;
        }
        case BROKER_NO_SUCH_LANE:
                log_error("%s: no lane \"%s\" is configured", what, param_string(p, "lane") ?: "?");
                return EXIT_USAGE;
        case BROKER_NO_SUCH_POOL:
                log_error("%s: no pool \"%s\"%s%s%s is configured", what, pool, param_string(p, "member") ? " with member \"" : "",
                          param_string(p, "member") ?: "", param_string(p, "member") ? "\"" : "");
                return EXIT_USAGE;
        case BROKER_PERMISSION_DENIED:
                if (param_string(p, "lease"))
                        log_error("%s: permission denied: lease %s belongs to another user (its owner or root may end it)",
                                  what, param_string(p, "lease"));
                else if (param_string(p, "lane"))
                        log_error("%s: permission denied by lane %s", what, param_string(p, "lane"));
                else if (param_string(p, "pool"))
                        log_error("%s: permission denied: root, brokerd's own user and pool %s's admin-users= and "
                                  "admin-groups= only", what, param_string(p, "pool"));
                else
                        log_error("%s: permission denied (root or the broker's own user only)", what);
                return EXIT_NO_PERMISSION;
        case BROKER_INVALID_PARAMETER:
                if (streq_ptr(param_string(p, "parameter"), "detach")) {
                        /* SPEC §11: nobody could fence a detached lease of a shared pool. */
                        log_error("%s: a detached lease is refused on a lane whose pools are shared through Redis: "
                                  "nobody could stop a job holding it when this host loses Redis (hold the "
                                  "lease with slotctl run, or use a local pool)", what);
                        return EXIT_USAGE;
                }
                log_error("%s: the broker refused parameter \"%s\"", what, param_string(p, "parameter") ?: "?");
                return EXIT_USAGE;
        case BROKER_NO_SUCH_LEASE:
                log_error("%s: no lease \"%s\"", what, param_string(p, "lease") ?: "?");
                return EXIT_FAILURE;
        case BROKER_METHOD_NOT_FOUND:
                log_error("%s: this broker does not implement %s", what, param_string(p, "method") ?: param_string(p, "interface") ?: "it");
                return EXIT_FAILURE;
        default: {
                char name_buf[CLI_PRINTABLE_SIZE(256)];
                _cleanup_free_ char *text_buf = text ? malloc(CLI_PRINTABLE_SIZE(strlen(text))) : NULL;
                log_error("%s failed: %s %s", what, cli_printable(name_buf, sizeof name_buf, name),
                          text_buf ? cli_printable(text_buf, CLI_PRINTABLE_SIZE(strlen(text)), text) : "");
                return EXIT_FAILURE;
        }
        }
}

int cli_call(const char *socket_path, const char *what, const char *method, json_t *parameters, json_t **ret_reply) {
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;
        _cleanup_free_ char *text = NULL, *reply = NULL;
        int r;

        if (parameters && json_format(parameters, &text, NULL) < 0) {
                log_error("Out of memory.");
                return EXIT_FAILURE;
        }
        /* A restarting brokerd closes the connections whose reply it had not sent yet (a Status waiting on its
         * snapshot: brokerd(8)); the next brokerd takes the socket's queue. A read is asked again, a few times;
         * a change (Cancel) never: it may have been applied. */
        bool read = streq(method, "io.slotbroker.Status") || streq(method, "io.slotbroker.Metrics") ||
                    streq(method, "io.slotbroker.History");
        for (unsigned attempt = 0;; attempt++) {
                r = cli_connect(socket_path, &c);
                if (r < 0)
                        return cli_exit_status_from_errno(r);
                r = broker_call(c, method, text, ret_reply ? &reply : NULL);
                if (r != -ECONNRESET || !read || attempt >= CLI_READ_RETRIES)
                        break;
                c = broker_client_free(c);
        }
        if (r < 0) {
                if (cli_errno_is_unreachable(r))
                        log_error_errno(r, "%s: the broker closed the connection", what);
                else
                        log_error_errno(r, "%s failed: %m", what);
                return cli_exit_status_from_errno(r);
        }
        if (r > 0)
                return cli_log_result(c, what, r, EXIT_FAILURE);
        if (ret_reply) {
                json_t *v = json_loads(reply, 0, NULL);
                if (!json_is_object(v)) {
                        json_decref(v);
                        log_error("%s: the broker's reply is not a JSON object", what);
                        return EXIT_FAILURE;
                }
                *ret_reply = v;
        }
        return 0;
}

const char *cli_format_duration_ms(char buf[static CLI_DURATION_MAX], uint64_t ms) {
        static const struct {
                uint64_t seconds;
                const char *unit;
        } units[] = { { 86400, "d" }, { 3600, "h" }, { 60, "min" }, { 1, "s" } };
        uint64_t s = ms / 1000;

        if (ms < 1000) {
                snprintf(buf, CLI_DURATION_MAX, "%" PRIu64 "ms", ms);
                return buf;
        }
        /* The two largest units only: "2h 5min", not "2h 5min 7s"; a live line needs no more. */
        for (size_t i = 0; i < ELEMENTSOF(units); i++) {
                if (s < units[i].seconds)
                        continue;
                uint64_t major = s / units[i].seconds;
                int n = snprintf(buf, CLI_DURATION_MAX, "%" PRIu64 "%s", major, units[i].unit);
                if (i + 1 < ELEMENTSOF(units)) {
                        uint64_t minor = s % units[i].seconds / units[i + 1].seconds;
                        if (minor > 0 && n > 0 && n < CLI_DURATION_MAX)
                                snprintf(buf + n, CLI_DURATION_MAX - (size_t) n, " %" PRIu64 "%s", minor, units[i + 1].unit);
                }
                break;
        }
        return buf;
}

/* The code point of the UTF-8 sequence at s (length in *ret_len), or -1 if s does not start one: overlong
 * forms, surrogates and values past U+10FFFF are not UTF-8 either. */
static int32_t utf8_decode(const unsigned char *s, size_t *ret_len) {
        uint32_t c = s[0], min;
        size_t len;

        if (c < 0x80) {
                *ret_len = 1;
                return (int32_t) c;
        }
        if (c >= 0xc2 && c <= 0xdf)
                len = 2, c &= 0x1f, min = 0x80;
        else if (c >= 0xe0 && c <= 0xef)
                len = 3, c &= 0x0f, min = 0x800;
        else if (c >= 0xf0 && c <= 0xf4)
                len = 4, c &= 0x07, min = 0x10000;
        else
                return -1;
        for (size_t i = 1; i < len; i++) {
                if ((s[i] & 0xc0) != 0x80) /* a NUL ends here too */
                        return -1;
                c = c << 6 | (s[i] & 0x3f);
        }
        if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
                return -1;
        *ret_len = len;
        return (int32_t) c;
}

static bool code_point_is_unsafe(int32_t c) {
        return (c >= 0x80 && c <= 0x9f) || (c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069);
}

/* The escape for the character c (-1: the byte b, which starts no UTF-8 sequence) in esc, or NULL when c
 * prints as itself. */
static const char *escape_for(int32_t c, unsigned char b, char esc[static 8]) {
        if (c < 0)
                snprintf(esc, 8, "\\x%02x", b);
        else if (c == '\\')
                return "\\\\";
        else if (c == '\t')
                return "\\t";
        else if (c == '\n')
                return "\\n";
        else if (c == '\r')
                return "\\r";
        else if (c < 0x20 || c == 0x7f)
                snprintf(esc, 8, "\\x%02x", (unsigned) c);
        else if (code_point_is_unsafe(c))
                snprintf(esc, 8, "\\u%04x", (unsigned) c & 0xffff);
        else
                return NULL;
        return esc;
}

const char *cli_printable(char *buf, size_t size, const char *s) {
        const unsigned char *p = (const unsigned char *) s;
        size_t n = 0;

        assert(size > 0);
        while (*p) {
                char esc[8];
                size_t len = 1;
                int32_t c = utf8_decode(p, &len);
                const char *out = escape_for(c, *p, esc);
                size_t out_len = out ? strlen(out) : len;

                if (n + out_len >= size)
                        break;
                memcpy(buf + n, out ?: (const char *) p, out_len);
                n += out_len;
                p += len;
        }
        buf[n] = '\0';
        return buf;
}

int cli_json_make_printable(json_t *v) {
        const char *key;
        json_t *e;
        size_t i;

        if (!v)
                return 0;
        switch (json_typeof(v)) {
        case JSON_STRING: {
                size_t size = CLI_PRINTABLE_SIZE(json_string_length(v));
                _cleanup_free_ char *buf = malloc(size);
                if (!buf)
                        return -ENOMEM;
                /* A string with a NUL prints up to it, as printf would. */
                cli_printable(buf, size, json_string_value(v));
                return json_string_set(v, buf) < 0 ? -ENOMEM : 0;
        }
        case JSON_OBJECT:
                json_object_foreach(v, key, e)
                        if (cli_json_make_printable(e) < 0)
                                return -ENOMEM;
                return 0;
        case JSON_ARRAY:
                json_array_foreach(v, i, e)
                        if (cli_json_make_printable(e) < 0)
                                return -ENOMEM;
                return 0;
        default:
                return 0;
        }
}

void cli_print_json(const json_t *v, FILE *f) {
        _cleanup_free_ char *text = NULL;
        if (json_format(v, &text, NULL) >= 0)
                fprintf(f, "%s\n", text);
}

const char *cli_format_position(char buf[static CLI_POSITION_MAX], const BrokerPosition *p) {
        char budget[CLI_DURATION_MAX];
        snprintf(buf, CLI_POSITION_MAX, "position %" PRIu64 " of %" PRIu64 ", budget %s", p->position, p->queued,
                 p->budget_ms < 0 ? "unbounded" : cli_format_duration_ms(budget, (uint64_t) p->budget_ms));
        return buf;
}

int cli_request_parse_option(const char *verb, int c, const char *value, CliRequest *r) {
        switch (c) {
        case 'l':
                /* --lane "$LANE" with $LANE unset, typically: say so, not "invalid request". */
                if (!*value)
                        return log_usage(verb, "--lane: empty (an unset variable?)");
                r->lane = value;
                return 1;
        case 'n':
                return cli_parse_unsigned("--slots", value, 1, 1u << 20, &r->slots) < 0 ? -EINVAL : 1;
        case CLI_ARG_NO_WAIT:
                r->no_wait = true;
                return 1;
        case CLI_ARG_MAX_WAIT: {
                usec_t t;
                if (cli_parse_duration("--max-wait", value, true, &t) < 0)
                        return -EINVAL;
                /* The protocol's queueWaitMs: 1 ms .. 2^31-1 ms (SPEC §3.2). */
                if (t != USEC_INFINITY && (t == 0 || DIV_ROUND_UP(t, USEC_PER_MSEC) > INT32_MAX))
                        return log_usage(verb, "--max-wait: \"%s\" is not between 1ms and 24d 20h", value);
                r->max_wait = t;
                return 1;
        }
        case CLI_ARG_JOB:
                if (strlen(value) > CLI_JOB_MAX)
                        return log_usage(verb, "--job: longer than %d bytes", CLI_JOB_MAX);
                r->job = value;
                return 1;
        case 'q':
                r->quiet = true;
                return 1;
        case CLI_ARG_CONFLICT_EXIT_CODE:
                return cli_parse_unsigned("--conflict-exit-code", value, 0, 255, &r->conflict_exit_code) < 0 ? -EINVAL
                                                                                                             : 1;
        case CLI_ARG_SOCKET:
                r->socket = value;
                return 1;
        case CLI_ARG_LABEL:
                /* SPEC §3.5: "L" or "!L"; checked here for a usage message the broker would refuse anyway. */
                if (!conf_label_is_valid(value[0] == '!' ? value + 1 : value))
                        return log_usage(verb, "--label: \"%s\" is not LABEL or !LABEL (a-z 0-9 . _ -, at most 64)", value);
                if (r->n_labels >= CLI_LABELS_MAX)
                        return log_usage(verb, "--label: at most %d", CLI_LABELS_MAX);
                r->labels[r->n_labels++] = value;
                return 1;
        case CLI_ARG_MEMBER:
                if (!conf_name_is_valid(value))
                        return log_usage(verb, "--member: \"%s\" is not a member name", value);
                r->member = value;
                return 1;
        default:
                return 0;
        }
}

/* A span meaning that long ago, spelled as journalctl takes it too: "1h", "-1h", "1h ago". Returns the
 * span or USEC_INFINITY. */
static usec_t parse_ago(const char *s) {
        _cleanup_free_ char *copy = strdup(s[0] == '-' ? s + 1 : s);
        usec_t span;
        if (!copy)
                return USEC_INFINITY;
        size_t len = strlen(copy);
        if (len > 4 && streq(copy + len - 4, " ago"))
                copy[len - 4] = '\0';
        if (timespan_parse(copy, USEC_PER_SEC, &span) < 0)
                return USEC_INFINITY;
        return span;
}

int cli_parse_time(const char *option, const char *s, int64_t *ret) {
        usec_t span;
        if (s[0] == '@') {
                char *end;
                errno = 0;
                long long v = strtoll(s + 1, &end, 10);
                if (errno == 0 && end != s + 1 && !*end && v >= 0 && v < INT64_MAX / (long long) USEC_PER_SEC) {
                        *ret = (int64_t) v * (int64_t) USEC_PER_SEC;
                        return 0;
                }
        } else if ((span = parse_ago(s)) != USEC_INFINITY) {
                usec_t now = now_realtime();
                *ret = (int64_t) usec_sub_unsigned(now, span);
                return 0;
        } else {
                static const char *const formats[] = { "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d" };
                for (size_t i = 0; i < ELEMENTSOF(formats); i++) {
                        struct tm tm = { .tm_isdst = -1 };
                        const char *end = strptime(s, formats[i], &tm);
                        if (!end || *end)
                                continue;
                        time_t t = mktime(&tm);
                        if (t == (time_t) -1 || t < 0)
                                break;
                        *ret = (int64_t) t * (int64_t) USEC_PER_SEC;
                        return 0;
                }
        }
        log_error("%s: invalid time \"%s\" (e.g. -1h or \"1h ago\", 2024-05-01 13:30, @1714563000)", option, s);
        return -EINVAL;
}
