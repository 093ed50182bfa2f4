/* SPDX-License-Identifier: MIT */
/* cli-util.h — what slotctl's verbs share: SPEC §6's exit codes, messages on stderr, option
 * values (durations, numbers, the CI job label), the connection to the broker and human output. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sysexits.h>

#include "broker.h"
#include "json.h"
#include "macro.h"
#include "time-util.h"

/* SPEC §6: one table, in slotctl(1). A command's own status passes through unchanged. */
enum {
        EXIT_USAGE = EX_USAGE,             /* 64: usage error, unknown lane, invalid parameter */
        EXIT_UNREACHABLE = EX_UNAVAILABLE, /* 69: the broker cannot be reached */
        EXIT_REFUSED = EX_TEMPFAIL,        /* 75: busy, full, timeout, shed, unavailable */
        EXIT_NO_PERMISSION = EX_NOPERM,    /* 77: the socket or the lane's ACL refused us */
        EXIT_TIMEOUT = 124,                /* --timeout, max-hold or an administrator ended the command */
        EXIT_NOT_FOUND = 127,              /* run: the command is nowhere (as shells and env(1)) */
};

/* The verbs of this module's files, as slotctl.c's table calls them: argv from the verb's name on;
 * they return the exit status. */
int verb_run(int argc, char *argv[]);
int verb_acquire(int argc, char *argv[]);
int verb_release(int argc, char *argv[]);
int verb_reserve(int argc, char *argv[]);
int verb_status(int argc, char *argv[]);
int verb_history(int argc, char *argv[]);
int verb_metrics(int argc, char *argv[]);
int verb_drain(int argc, char *argv[]);
int verb_undrain(int argc, char *argv[]);
int verb_quarantine(int argc, char *argv[]);
int verb_restore(int argc, char *argv[]);
int verb_cancel(int argc, char *argv[]);
int verb_reload(int argc, char *argv[]);
int verb_simulate(int argc, char *argv[]);
int verb_report(int argc, char *argv[]);

DEFINE_TRIVIAL_CLEANUP_FUNC(BrokerClient *, broker_client_free);
DEFINE_TRIVIAL_CLEANUP_FUNC(BrokerLease *, broker_lease_free);

/* The longest job label brokerd takes (its JOB_MAX); a longer one is InvalidParameter there. */
#define CLI_JOB_MAX 1024

/* "slotctl: …" on stderr. The _errno variants put error in errno for "%m" and return -abs(error), so
 * that `return log_error_errno(r, "…: %m");` propagates r. */
void log_error(const char *format, ...) _printf_(1, 2);
void log_warning(const char *format, ...) _printf_(1, 2);
void log_notice(const char *format, ...) _printf_(1, 2);
int log_error_errno(int error, const char *format, ...) _printf_(2, 3);
/* A usage error: the message, then a pointer to --help. Returns -EINVAL. */
int log_usage(const char *verb, const char *format, ...) _printf_(2, 3);
/* What getopt_long() reports as ':' (a value missing) or anything else it did not expect (an unknown
 * option), for optstrings that start with ':' and opterr = 0, as a usage error. Returns -EINVAL. */
int log_usage_option(const char *verb, int opt, char *argv[]);
/* --reason as the broker takes it (conf_reason_is_valid()), else a usage error saying why. */
bool cli_reason_is_valid(const char *verb, const char *reason);

/* The options of the verbs that talk to the broker: --socket and --help always, --json where the verb
 * prints data, and the verb's own (extra, passed to on_extra, which returns < 0 after a usage error). */
typedef struct CliOptions {
        const char **socket_path;   /* set when --socket is given */
        bool *json;                 /* NULL: no --json */
        const struct option *extra; /* up to 12, terminated by {} */
        int (*on_extra)(int c, const char *value);
} CliOptions;
/* Returns 1 to go on with argv[optind…] as the verb's arguments; 0 after printing the help; -EINVAL after
 * a usage error. */
int cli_parse_options(const char *verb, int argc, char *argv[], void (*help)(const char *verb), const CliOptions *o);

/* Option values. Each logs what is wrong, naming the option, and returns -EINVAL; *ret untouched then. */
int cli_parse_duration(const char *option, const char *s, bool allow_infinity, usec_t *ret);

/* The options of every verb that asks for slots (run, acquire), parsed in one place. */
#define CLI_LABELS_MAX 32

typedef struct CliRequest {
        const char *socket;
        const char *lane;
        unsigned slots;            /* 0: the broker's default (1) */
        bool no_wait;
        usec_t max_wait;           /* USEC_INFINITY: no cap */
        const char *job;
        bool quiet;
        unsigned conflict_exit_code;
        const char *labels[CLI_LABELS_MAX + 1]; /* --label, NULL-terminated */
        size_t n_labels;
        const char *member;        /* --member */
} CliRequest;
#define CLI_REQUEST_INIT { .max_wait = USEC_INFINITY, .conflict_exit_code = EXIT_REFUSED }

enum {
        CLI_ARG_NO_WAIT = 0x1000, /* above any verb's own ARG_* */
        CLI_ARG_MAX_WAIT,
        CLI_ARG_JOB,
        CLI_ARG_CONFLICT_EXIT_CODE,
        CLI_ARG_SOCKET,
        CLI_ARG_LABEL,
        CLI_ARG_MEMBER,
};
#define CLI_REQUEST_OPTIONS                                                            \
        { "lane", required_argument, NULL, 'l' },                                      \
        { "slots", required_argument, NULL, 'n' },                                     \
        { "no-wait", no_argument, NULL, CLI_ARG_NO_WAIT },                             \
        { "max-wait", required_argument, NULL, CLI_ARG_MAX_WAIT },                     \
        { "job", required_argument, NULL, CLI_ARG_JOB },                               \
        { "quiet", no_argument, NULL, 'q' },                                           \
        { "conflict-exit-code", required_argument, NULL, CLI_ARG_CONFLICT_EXIT_CODE }, \
        { "socket", required_argument, NULL, CLI_ARG_SOCKET },                         \
        { "label", required_argument, NULL, CLI_ARG_LABEL },                           \
        { "member", required_argument, NULL, CLI_ARG_MEMBER }
#define CLI_REQUEST_SHORT_OPTIONS "l:n:q"

/* Takes getopt's c and optarg if c is one of CLI_REQUEST_OPTIONS. Returns 1 if it was, 0 if not, or
 * -EINVAL after a usage message naming verb. */
int cli_request_parse_option(const char *verb, int c, const char *value, CliRequest *r);
int cli_parse_unsigned(const char *option, const char *s, unsigned min, unsigned max, unsigned *ret);
/* A time as --since and --until take it: "@EPOCH", a time span meaning that long ago ("1h", "-1h", "1h ago"),
 * or a local date and time ("2024-05-01", "2024-05-01 13:30", "2024-05-01 13:30:05"). Returns 0 and µs since
 * the epoch in *ret, or -EINVAL after logging. */
int cli_parse_time(const char *option, const char *s, int64_t *ret);

/* The job label CI systems would want in status and history: CI_JOB_URL (GitLab), the run's URL and job
 * name (GitHub Actions), BUILDKITE_BUILD_URL, BUILD_URL (Jenkins), in that order; cut to CLI_JOB_MAX at a
 * UTF-8 boundary. Returns 0 and a new string or NULL (none set) in *ret; -ENOMEM. */
int cli_job_from_environment(char **ret);

/* True for the connect() and I/O errors that mean "no broker there", which SPEC §6 maps to 69. */
bool cli_errno_is_unreachable(int error);

/* Connects (socket_path NULL: $SLOTBROKER_SOCKET, else the default) and logs what went wrong. Returns 0;
 * a negative errno, already logged: see cli_exit_status_from_errno(). */
int cli_connect(const char *socket_path, BrokerClient **ret);

/* Exit statuses for failures: unreachable → 69, permission → 77, -EINVAL → 64, else 1. */
int cli_exit_status_from_errno(int error);

/* Logs a refusal or error reply of a call (result > 0) with what the broker said, and returns its exit
 * status: conflict_exit_code for busy/full/timeout/shed/unavailable, 64 for an unknown lane or an invalid
 * parameter, 77 for permission denied, else 1. what names the request: "acquire", "drain", … */
int cli_log_result(BrokerClient *c, const char *what, int result, int conflict_exit_code);

/* How many times a read (Status, Metrics, History) is asked again when the broker closes the connection
 * before its reply: a restart (brokerd(8)). */
#define CLI_READ_RETRIES 3

/* One call with one reply, everything logged: connects, calls, parses the reply. Returns 0 and the
 * reply's parameters in *ret_reply (NULL: dropped), or an exit status (> 0) after logging. */
int cli_call(const char *socket_path, const char *what, const char *method, json_t *parameters, json_t **ret_reply);

/* Human durations: "850ms", "12s", "1min 30s", "2h 5min" (coarser as they grow). Return buf. */
#define CLI_DURATION_MAX 32
const char *cli_format_duration_ms(char buf[static CLI_DURATION_MAX], uint64_t ms);

/* Strings from the broker are other users' words (a --job label, a uid's request): before text output they
 * are made printable, so that none can move the cursor, retitle or clear an administrator's terminal.
 * Escaped as \xNN: C0 controls (\t, \n, \r by name), DEL and bytes that are not UTF-8; as \uNNNN: C1
 * controls and the bidirectional overrides and isolates (U+202A–U+202E, U+2066–U+2069), which reorder what
 * a line shows; and a backslash as \\, so that an escape cannot be forged. JSON output stays exact.
 *
 * Writes the printable form of s into buf (NUL-terminated, cut before an escape or character that does
 * not fit) and returns buf. */
const char *cli_printable(char *buf, size_t size, const char *s);
/* Bytes enough for the printable form of len bytes, and its NUL. */
#define CLI_PRINTABLE_SIZE(len) (4 * (len) + 1)
/* Replaces every string in v (NULL: none), at any depth, by its printable form (object keys stay). Returns
 * 0 or -ENOMEM. */
int cli_json_make_printable(json_t *v);

/* Prints a JSON value on one line, and a newline. */
void cli_print_json(const json_t *v, FILE *f);

/* How a "queued" position reads in messages: "position 2 of 5, budget 5min". Returns buf. */
#define CLI_POSITION_MAX 128
const char *cli_format_position(char buf[static CLI_POSITION_MAX], const BrokerPosition *p);
