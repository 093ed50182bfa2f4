/* SPDX-License-Identifier: MIT */
/* admin.c — the administrator's verbs (root or the broker's own user): drain, undrain, cancel, reload. */
#include <errno.h>
#include <getopt.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli-util.h"

static const char *arg_socket = NULL;
static bool arg_json = false;

/* ---- drain, undrain ---- */

static void drain_help(const char *verb) {
        bool on = streq(verb, "drain");
        printf("slotctl %s [OPTIONS…] POOL [MEMBER]\n\n"
               "%s\n\n"
               "%s"
               "     --socket=PATH   Talk to the broker at PATH\n"
               "  -h --help          Show this help\n",
               verb,
               on ? "Drain a pool, or one member of it: nothing new is granted there; its holders finish,\n"
                    "and the requests waiting on a drained pool are refused (unavailable)."
                  : "Undrain a pool, or one member of it: it grants again.",
               on ? "     --reason=TEXT   Why (slotctl status, the journal and the history show it)\n"
                    "     --until=TIME    Undrain by itself at TIME (2024-05-01 13:30; @EPOCH), at most 3650d ahead\n"
                  : "");
}

static const char *arg_drain_reason = NULL;
static int64_t arg_drain_until = -1;

/* The broker refuses the same (its members.state holds no later instant); said here with the option's name. */
#define DRAIN_UNTIL_AHEAD_MAX ((usec_t) 3650 * 24 * 3600 * USEC_PER_SEC)

static int drain_option(int c, const char *value);

static bool pool_exists(BrokerClient *c, const char *pool) {
        _cleanup_free_ char *text = NULL;
        if (broker_call(c, "io.slotbroker.Status", NULL, &text) != 0)
                return false;
        _cleanup_(json_decrefp) json_t *st = json_loads(text, 0, NULL);
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(st, "pools"), i, p)
                if (streq_ptr(json_string_value(json_object_get(p, "name")), pool))
                        return true;
        return false;
}

static int drain(const char *verb, bool on, int argc, char *argv[]) {
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;
        _cleanup_(json_decrefp) json_t *p = NULL;
        _cleanup_free_ char *text = NULL;
        int r;

        enum { ARG_REASON = 0x200, ARG_UNTIL }; /* above cli_parse_options()'s own */
        static const struct option extra[] = {
                { "reason", required_argument, NULL, ARG_REASON },
                { "until", required_argument, NULL, ARG_UNTIL },
                {},
        };
        r = cli_parse_options(verb, argc, argv, drain_help,
                              &(CliOptions) { .socket_path = &arg_socket, .extra = on ? extra : NULL,
                                              .on_extra = drain_option });
        if (r <= 0)
                return r < 0 ? EXIT_USAGE : EXIT_SUCCESS;
        if (optind >= argc || argc - optind > 2) {
                log_usage(verb, "%s", optind >= argc ? "a pool is missing" : "a pool and at most one member");
                return EXIT_USAGE;
        }
        if (arg_drain_reason && !cli_reason_is_valid(verb, arg_drain_reason))
                return EXIT_USAGE;
        if (arg_drain_until >= 0 && (usec_t) arg_drain_until <= now_realtime()) {
                log_usage(verb, "--until: that time has passed (a future time: 2024-05-01 13:30, @EPOCH)");
                return EXIT_USAGE;
        }
        if (arg_drain_until >= 0 && (usec_t) arg_drain_until - now_realtime() > DRAIN_UNTIL_AHEAD_MAX) {
                log_usage(verb, "--until: at most 3650 days ahead (without --until the drain lasts until undrain)");
                return EXIT_USAGE;
        }
        const char *pool = argv[optind], *member = argc - optind > 1 ? argv[optind + 1] : NULL;

        p = json_pack("{s:s, s:b}", "pool", pool, "on", on);
        if (p && arg_drain_reason && json_object_set_new(p, "reason", json_string(arg_drain_reason)) < 0) {
                json_decref(p);
                p = NULL;
        }
        if (p && arg_drain_until >= 0)
                json_object_set_new(p, "until", json_integer((json_int_t) arg_drain_until));
        if (!p || (member && json_object_set_new(p, "member", json_string(member)) < 0) || json_format(p, &text, NULL) < 0) {
                log_error("invalid pool or member name (not UTF-8?)");
                return EXIT_USAGE;
        }
        r = cli_connect(arg_socket, &c);
        if (r < 0)
                return cli_exit_status_from_errno(r);
        r = broker_call(c, "io.slotbroker.Drain", text, NULL);
        if (r < 0) {
                log_error_errno(r, "%s failed: %m", verb);
                return cli_exit_status_from_errno(r);
        }
        if (r == BROKER_INVALID_PARAMETER && broker_client_error_parameters(c) &&
            (strstr(broker_client_error_parameters(c), "\"reason\"") ||
             strstr(broker_client_error_parameters(c), "\"until\""))) {
                log_error("%s: the broker refused --reason/--until for pool %s (--until has passed or is more than "
                          "3650 days ahead, or a bad reason)",
                          verb, pool);
                return EXIT_USAGE;
        }
        if (r == BROKER_INVALID_PARAMETER || r == BROKER_NO_SUCH_POOL) {
                /* The error names the pool either way: whether the pool or its member is unknown, Status says. */
                if (member && pool_exists(c, pool))
                        log_error("%s: pool %s has no member \"%s\"", verb, pool, member);
                else
                        log_error("%s: no pool \"%s\" is configured", verb, pool);
                return EXIT_USAGE;
        }
        if (r > 0)
                return cli_log_result(c, verb, r, EXIT_FAILURE);
        return EXIT_SUCCESS;
}

static int drain_option(int c, const char *value) {
        if (c == 0x200) {
                arg_drain_reason = value;
                return 0;
        }
        return cli_parse_time("--until", value, &arg_drain_until);
}

int verb_drain(int argc, char *argv[]) {
        return drain("drain", true, argc, argv);
}

int verb_undrain(int argc, char *argv[]) {
        return drain("undrain", false, argc, argv);
}

/* ---- quarantine, restore (SPEC §3.6) ---- */

static const char *arg_reason = NULL;

static int reason_option(int c, const char *value) {
        arg_reason = value;
        return 0;
}

static void quarantine_help(const char *verb) {
        if (streq(verb, "quarantine"))
                printf("slotctl quarantine [OPTIONS…] POOL MEMBER --reason=TEXT\n\n"
                       "Quarantine a member: only health lanes (health=yes) get it until it is restored;\n"
                       "its holder, if any, keeps it. Root and the pool's admin-users=/admin-groups=.\n\n"
                       "     --reason=TEXT   Why (required; shown by slotctl status and in the journal)\n");
        else
                printf("slotctl restore [OPTIONS…] POOL MEMBER\n\n"
                       "Restore a quarantined member: every lane gets it again.\n"
                       "Root and the pool's admin-users=/admin-groups=.\n\n");
        printf("     --socket=PATH   Talk to the broker at PATH\n"
               "  -h --help          Show this help\n");
}

static int quarantine(const char *verb, bool on, int argc, char *argv[]) {
        enum { ARG_REASON = 0x200 }; /* above cli_parse_options()'s own */
        static const struct option extra[] = { { "reason", required_argument, NULL, ARG_REASON }, {} };
        _cleanup_(json_decrefp) json_t *p = NULL;
        int r;

        arg_reason = NULL;
        r = cli_parse_options(verb, argc, argv, quarantine_help,
                              &(CliOptions) { .socket_path = &arg_socket, .extra = on ? extra : NULL,
                                              .on_extra = reason_option });
        if (r <= 0)
                return r < 0 ? EXIT_USAGE : EXIT_SUCCESS;
        if (argc - optind != 2) {
                log_usage(verb, "%s", "a pool and a member");
                return EXIT_USAGE;
        }
        if (on && !arg_reason) {
                log_usage(verb, "--reason=TEXT is required: say why, for the people who find it quarantined");
                return EXIT_USAGE;
        }
        if (on && !cli_reason_is_valid(verb, arg_reason))
                return EXIT_USAGE;
        const char *pool = argv[optind], *member = argv[optind + 1];
        p = json_pack("{s:s, s:s}", "pool", pool, "member", member);
        if (!p || (on && json_object_set_new(p, "reason", json_string(arg_reason)) < 0)) {
                log_error("invalid pool, member or reason (not UTF-8?)");
                return EXIT_USAGE;
        }
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;
        _cleanup_free_ char *text = NULL;
        if (json_format(p, &text, NULL) < 0) {
                log_error("Out of memory.");
                return EXIT_FAILURE;
        }
        r = cli_connect(arg_socket, &c);
        if (r < 0)
                return cli_exit_status_from_errno(r);
        r = broker_call(c, on ? "io.slotbroker.Quarantine" : "io.slotbroker.Restore", text, NULL);
        if (r < 0) {
                log_error_errno(r, "%s failed: %m", verb);
                return cli_exit_status_from_errno(r);
        }
        if (r == BROKER_NO_SUCH_POOL) {
                if (pool_exists(c, pool))
                        log_error("%s: pool %s has no member \"%s\"", verb, pool, member);
                else
                        log_error("%s: no pool \"%s\" is configured", verb, pool);
                return EXIT_USAGE;
        }
        if (r == BROKER_INVALID_PARAMETER) {
                const char *params = broker_client_error_parameters(c);
                if (params && strstr(params, "\"pool\"")) {
                        log_error("%s: pool %s has no members= (quarantine takes a member out of use)", verb, pool);
                        return EXIT_USAGE;
                }
        }
        if (r > 0)
                return cli_log_result(c, verb, r, EXIT_FAILURE);
        return EXIT_SUCCESS;
}

int verb_quarantine(int argc, char *argv[]) {
        return quarantine("quarantine", true, argc, argv);
}

int verb_restore(int argc, char *argv[]) {
        return quarantine("restore", false, argc, argv);
}

/* ---- cancel ---- */

static void cancel_help(void) {
        printf("slotctl cancel [OPTIONS…]\n\n"
               "Refuse the waiting requests that match every filter given (they fail with\n"
               "\"unavailable\", reason \"cancelled\"). Leases are not touched.\n\n"
               "     --pool=POOL     Requests waiting on POOL\n"
               "     --lane=LANE     Requests of LANE\n"
               "     --job=JOB       Requests with this job label\n"
               "     --uid=USER      Requests of this user (name or number)\n"
               "     --all           Every waiting request (needed when no filter is given)\n"
               "     --json          Print the broker's reply as it is\n"
               "     --socket=PATH   Talk to the broker at PATH\n"
               "  -h --help          Show this help\n");
}

static int parse_uid(const char *s, uid_t *ret) {
        unsigned u;
        char *end;
        errno = 0;
        unsigned long v = strtoul(s, &end, 10);
        if (*s && !*end && errno == 0 && s[0] != '-' && v < UINT32_MAX) {
                *ret = (uid_t) v;
                return 0;
        }
        struct passwd *pw = getpwnam(s);
        if (!pw) {
                log_error("--uid: no user \"%s\"", s);
                return -EINVAL;
        }
        u = pw->pw_uid;
        *ret = u;
        return 0;
}

int verb_cancel(int argc, char *argv[]) {
        enum { ARG_POOL = 0x100, ARG_LANE, ARG_JOB, ARG_UID, ARG_ALL, ARG_JSON, ARG_SOCKET };
        static const struct option options[] = {
                { "pool", required_argument, NULL, ARG_POOL },
                { "lane", required_argument, NULL, ARG_LANE },
                { "job", required_argument, NULL, ARG_JOB },
                { "uid", required_argument, NULL, ARG_UID },
                { "all", no_argument, NULL, ARG_ALL },
                { "json", no_argument, NULL, ARG_JSON },
                { "socket", required_argument, NULL, ARG_SOCKET },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        _cleanup_(json_decrefp) json_t *p = json_object(), *reply = NULL;
        bool all = false;
        uid_t uid;
        int r, opt;

        if (!p) {
                log_error("Out of memory.");
                return EXIT_FAILURE;
        }
        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, ":h", options, NULL)) >= 0)
                switch (opt) {
                case ARG_POOL:
                case ARG_LANE:
                case ARG_JOB: {
                        const char *key = opt == ARG_POOL ? "pool" : opt == ARG_LANE ? "lane" : "job";
                        if (json_object_set_new(p, key, json_string(optarg)) < 0) {
                                log_usage("cancel", "--%s: not UTF-8", key);
                                return EXIT_USAGE;
                        }
                        break;
                }
                case ARG_UID:
                        if (parse_uid(optarg, &uid) < 0)
                                return EXIT_USAGE;
                        json_object_set_new(p, "uid", json_integer((json_int_t) uid));
                        break;
                case ARG_ALL:
                        all = true;
                        break;
                case ARG_JSON:
                        arg_json = true;
                        break;
                case ARG_SOCKET:
                        arg_socket = optarg;
                        break;
                case 'h':
                        cancel_help();
                        return EXIT_SUCCESS;
                default: /* ':' or '?' */
                        log_usage_option("cancel", opt, argv);
                        return EXIT_USAGE;
                }
        if (optind < argc) {
                log_usage("cancel", "unexpected argument '%s'", argv[optind]);
                return EXIT_USAGE;
        }
        /* An empty filter matches every waiter of every pool: too much to happen by a typo. */
        if (json_object_size(p) == 0 && !all) {
                log_usage("cancel", "no filter given: use --pool, --lane, --job or --uid, or --all for every waiter");
                return EXIT_USAGE;
        }

        r = cli_call(arg_socket, "cancel", "io.slotbroker.Cancel", p, &reply);
        if (r != 0)
                return r;
        if (arg_json)
                cli_print_json(reply, stdout);
        else {
                json_int_t n = json_integer_value(json_object_get(reply, "cancelled"));
                printf("Cancelled %" JSON_INTEGER_FORMAT " waiting request%s.\n", n, n == 1 ? "" : "s");
        }
        return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* ---- reload ---- */

static void reload_help(const char *verb) {
        printf("slotctl reload [OPTIONS…]\n\n"
               "Make the broker read its configuration again, and wait until it is applied. A\n"
               "configuration with errors is rejected whole (the old one stays): each error is printed\n"
               "and the exit status is 1.\n\n"
               "     --socket=PATH   Talk to the broker at PATH\n"
               "  -h --help          Show this help\n");
}

int verb_reload(int argc, char *argv[]) {
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;
        int r;

        r = cli_parse_options("reload", argc, argv, reload_help, &(CliOptions) { .socket_path = &arg_socket });
        if (r <= 0)
                return r < 0 ? EXIT_USAGE : EXIT_SUCCESS;
        if (optind < argc) {
                log_usage("reload", "unexpected argument '%s'", argv[optind]);
                return EXIT_USAGE;
        }

        r = cli_connect(arg_socket, &c);
        if (r < 0)
                return cli_exit_status_from_errno(r);
        r = broker_call(c, "io.slotbroker.Reload", NULL, NULL);
        if (r < 0) {
                log_error_errno(r, "reload failed: %m");
                return cli_exit_status_from_errno(r);
        }
        if (r == BROKER_RELOAD_FAILED) {
                _cleanup_(json_decrefp) json_t *p = json_loads(broker_client_error_parameters(c) ?: "{}", 0, NULL);
                json_t *errors = json_object_get(p, "errors"), *e;
                size_t i;
                if (cli_json_make_printable(errors) < 0) {
                        log_error("Out of memory.");
                        return EXIT_FAILURE;
                }
                log_error("reload failed; the old configuration stays in force:");
                json_array_foreach(errors, i, e)
                        fprintf(stderr, "  %s\n", json_string_value(e) ?: "?");
                return EXIT_FAILURE;
        }
        if (r > 0)
                return cli_log_result(c, "reload", r, EXIT_FAILURE);
        return EXIT_SUCCESS;
}
