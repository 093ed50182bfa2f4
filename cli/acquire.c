/* SPDX-License-Identifier: MIT */
/* acquire.c — slotctl acquire --detach and slotctl release: a lease held by no process, for a set-up
 * step and a later tear-down step (SPEC §3.4 "Detached leases"). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli-util.h"

static CliRequest arg_request = CLI_REQUEST_INIT;
static bool arg_detach = false;
static usec_t arg_max_hold = 0;
static bool arg_json = false;

static void acquire_help(void) {
        printf("slotctl acquire --detach --max-hold=DURATION [OPTIONS…]\n\n"
               "Acquire a detached lease, held by no process, and print its id. It ends with\n"
               "'slotctl release ID' or when --max-hold runs out.\n\n"
               "     --detach                   Mandatory: the lease outlives this command\n"
               "     --max-hold=DURATION        Mandatory: the lease ends after DURATION at the latest\n"
               "  -l --lane=LANE                Ask under LANE (default: $SLOTBROKER_LANE)\n"
               "  -n --slots=N                  Ask for N slots (default: 1)\n"
               "     --label=[!]LABEL           Members that carry LABEL (with !: that do not); repeatable\n"
               "     --member=NAME              The member NAME\n"
               "     --no-wait                  Refuse at once rather than queue\n"
               "     --max-wait=DURATION        Wait at most DURATION\n"
               "     --job=NAME                 Label for status and history (default: the CI job's URL)\n"
               "     --json                     Print the lease as JSON\n"
               "  -q --quiet                    Print nothing while waiting\n"
               "     --conflict-exit-code=N     Exit N when refused (default: 75)\n"
               "     --socket=PATH              Talk to the broker at PATH\n"
               "  -h --help                     Show this help\n");
}

static int acquire_parse_argv(int argc, char *argv[]) {
        enum {
                ARG_DETACH = 0x100,
                ARG_MAX_HOLD,
                ARG_JSON,
        };
        static const struct option options[] = {
                { "detach", no_argument, NULL, ARG_DETACH },
                { "max-hold", required_argument, NULL, ARG_MAX_HOLD },
                { "json", no_argument, NULL, ARG_JSON },
                { "help", no_argument, NULL, 'h' },
                CLI_REQUEST_OPTIONS,
                {},
        };
        int c;

        optind = 0;
        opterr = 0;
        while ((c = getopt_long(argc, argv, ":" CLI_REQUEST_SHORT_OPTIONS "h", options, NULL)) >= 0)
                switch (c) {
                case ARG_DETACH:
                        arg_detach = true;
                        break;
                case ARG_MAX_HOLD:
                        if (cli_parse_duration("--max-hold", optarg, false, &arg_max_hold) < 0)
                                return -EINVAL;
                        if (arg_max_hold < USEC_PER_MSEC)
                                return log_usage("acquire", "--max-hold: must be at least 1ms");
                        break;
                case ARG_JSON:
                        arg_json = true;
                        break;
                case 'h':
                        acquire_help();
                        return 0;
                default: {
                        int k = cli_request_parse_option("acquire", c, optarg, &arg_request);
                        if (k < 0)
                                return k;
                        if (k == 0) /* also ':' and '?' */
                                return log_usage_option("acquire", c, argv);
                        break;
                }
                }

        if (optind < argc)
                return log_usage("acquire", "unexpected argument '%s'", argv[optind]);
        /* A lease held by slotctl's own connection would end as slotctl exits: use 'slotctl run'. */
        if (!arg_detach)
                return log_usage("acquire", "only detached leases: use --detach, or 'slotctl run' to hold a slot for a command");
        if (arg_max_hold == 0)
                return log_usage("acquire", "--detach needs --max-hold=DURATION: a detached lease must end on its own");
        if (!arg_request.lane) {
                const char *e = getenv("SLOTBROKER_LANE");
                if (!e || !*e)
                        return log_usage("acquire", "no lane given: use --lane=LANE or set $SLOTBROKER_LANE");
                arg_request.lane = e;
        }
        return 1;
}

static void on_position(const BrokerPosition *p, void *userdata) {
        bool *announced = userdata;
        char position[CLI_POSITION_MAX], pool[CLI_PRINTABLE_SIZE(256)];
        if (arg_request.quiet || *announced)
                return;
        /* One line: a set-up step is short, and no live line is worth a second code path. */
        log_notice("waiting for a slot of pool %s: %s", cli_printable(pool, sizeof pool, p->pool ?: "?"),
                   cli_format_position(position, p));
        *announced = true;
}

/* A detached lease's id (or its JSON) on stdout. Nobody learnt the id when that fails: its slots go back rather
 * than stay held until max-hold. */
static int print_lease(BrokerClient *c, BrokerLease *l) {
        if (arg_json)
                printf("%s\n", broker_lease_json(l));
        else
                printf("%s\n", broker_lease_id(l));
        if (fflush(stdout) != 0) {
                log_error_errno(errno, "Failed to print the lease: %m");
                (void) broker_release(c, broker_lease_id(l));
                return EXIT_FAILURE;
        }
        return EXIT_SUCCESS;
}

int verb_acquire(int argc, char *argv[]) {
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;
        _cleanup_(broker_lease_freep) BrokerLease *l = NULL;
        _cleanup_free_ char *job = NULL;
        bool announced = false;
        int r;

        r = acquire_parse_argv(argc, argv);
        if (r <= 0)
                return r < 0 ? EXIT_USAGE : EXIT_SUCCESS;
        if (!arg_request.job) {
                if (cli_job_from_environment(&job) < 0) {
                        log_error("Out of memory.");
                        return EXIT_FAILURE;
                }
                arg_request.job = job;
        }

        r = cli_connect(arg_request.socket, &c);
        if (r < 0)
                return cli_exit_status_from_errno(r);

        BrokerAcquireOptions o = BROKER_ACQUIRE_OPTIONS_INIT;
        o.lane = arg_request.lane;
        o.slots = arg_request.slots;
        o.wait = arg_request.no_wait ? BROKER_WAIT_NO : BROKER_WAIT_DEFAULT;
        o.queue_wait_ms = arg_request.max_wait == USEC_INFINITY ? 0 : DIV_ROUND_UP(arg_request.max_wait, USEC_PER_MSEC);
        o.job = arg_request.job;
        o.labels = arg_request.n_labels > 0 ? arg_request.labels : NULL;
        o.member = arg_request.member;
        o.detach = true;
        o.max_hold_ms = DIV_ROUND_UP(arg_max_hold, USEC_PER_MSEC);
        o.on_position = on_position;
        o.userdata = &announced;

        /* Interrupted while waiting, slotctl dies of the signal: closing the connection withdraws. */
        r = broker_acquire(c, &o, &l);
        if (r < 0) {
                if (cli_errno_is_unreachable(r))
                        log_error_errno(r, "lost the connection to the broker: %m");
                else
                        log_error_errno(r, "acquire failed: %m");
                return cli_exit_status_from_errno(r);
        }
        if (r > 0)
                return cli_log_result(c, "acquire", r, (int) arg_request.conflict_exit_code);

        return print_lease(c, l);
}

/* ---- reserve ---- */

/* SPEC §3.6: the broker refuses the same; said here with the option's name. */
#define RESERVE_FOR_MAX (3650 * 24 * 3600 * USEC_PER_SEC)

static void reserve_help(void) {
        printf("slotctl reserve [OPTIONS…] POOL --for=DURATION --reason=TEXT\n\n"
               "Reserve a slot of a local pool for a person: ahead of every waiting job, take the next\n"
               "matching member that frees (or one free now), as a detached lease, and print its id.\n"
               "It ends after --for or with 'slotctl release ID'. Root and the pool's\n"
               "admin-users=/admin-groups= only.\n\n"
               "     --for=DURATION     Mandatory: how long it is held from its grant (at most 3650d)\n"
               "     --reason=TEXT      Mandatory: why, for status and history (one line, ≤ 1024 bytes)\n"
               "     --member=NAME      The member NAME\n"
               "     --label=[!]LABEL   Members that carry LABEL (with !: that do not); repeatable\n"
               "     --json             Print the lease as JSON\n"
               "  -q --quiet            Print nothing while waiting\n"
               "     --socket=PATH      Talk to the broker at PATH\n"
               "  -h --help             Show this help\n");
}

static void on_reserve_position(const BrokerPosition *p, void *userdata) {
        size_t *last = userdata;
        char position[CLI_POSITION_MAX], pool[CLI_PRINTABLE_SIZE(256)];
        if (arg_request.quiet || p->position == *last)
                return;
        /* Said again whenever it moves: a person waits for it. */
        log_notice("reservation waiting for pool %s: %s", cli_printable(pool, sizeof pool, p->pool ?: "?"),
                   cli_format_position(position, p));
        *last = p->position;
}

int verb_reserve(int argc, char *argv[]) {
        enum { ARG_FOR = 0x100, ARG_REASON, ARG_JSON };
        static const struct option options[] = {
                { "for", required_argument, NULL, ARG_FOR },
                { "reason", required_argument, NULL, ARG_REASON },
                { "json", no_argument, NULL, ARG_JSON },
                { "help", no_argument, NULL, 'h' },
                CLI_REQUEST_OPTIONS,
                {},
        };
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;
        _cleanup_(broker_lease_freep) BrokerLease *l = NULL;
        const char *reason = NULL;
        usec_t hold = 0;
        size_t last = 0;
        int k, r;

        optind = 0;
        opterr = 0;
        while ((k = getopt_long(argc, argv, ":qh", options, NULL)) >= 0)
                switch (k) {
                case ARG_FOR:
                        if (cli_parse_duration("--for", optarg, false, &hold) < 0)
                                return EXIT_USAGE;
                        if (hold < USEC_PER_MSEC || hold > RESERVE_FOR_MAX) {
                                log_usage("reserve", "--for: from 1ms to 3650d");
                                return EXIT_USAGE;
                        }
                        break;
                case ARG_REASON:
                        reason = optarg;
                        break;
                case ARG_JSON:
                        arg_json = true;
                        break;
                case 'h':
                        reserve_help();
                        return EXIT_SUCCESS;
                case 'l':
                case 'n':
                case CLI_ARG_NO_WAIT:
                case CLI_ARG_MAX_WAIT:
                case CLI_ARG_JOB:
                case CLI_ARG_CONFLICT_EXIT_CODE:
                        /* A reservation is one member of one pool, waits as long as it takes, and its job is
                         * its reason. */
                        log_usage("reserve", "%s", "--lane, --slots, --no-wait, --max-wait, --job and "
                                  "--conflict-exit-code are not for a reservation (one slot of POOL, waited for)");
                        return EXIT_USAGE;
                default:
                        r = cli_request_parse_option("reserve", k, optarg, &arg_request);
                        if (r < 0)
                                return EXIT_USAGE;
                        if (r == 0) /* also ':' and '?' */
                                return log_usage_option("reserve", k, argv), EXIT_USAGE;
                        break;
                }
        if (argc - optind != 1) {
                log_usage("reserve", "%s", optind >= argc ? "a pool is missing" : "one pool only");
                return EXIT_USAGE;
        }
        if (hold == 0) {
                log_usage("reserve", "--for=DURATION is required: a reservation must end on its own");
                return EXIT_USAGE;
        }
        if (!reason) {
                log_usage("reserve", "--reason=TEXT is required: say why, for the jobs that wait behind it");
                return EXIT_USAGE;
        }
        if (!cli_reason_is_valid("reserve", reason))
                return EXIT_USAGE;
        if (arg_request.member && arg_request.n_labels > 0) {
                log_usage("reserve", "--member or --label, not both");
                return EXIT_USAGE;
        }

        r = cli_connect(arg_request.socket, &c);
        if (r < 0)
                return cli_exit_status_from_errno(r);

        BrokerAcquireOptions o = BROKER_ACQUIRE_OPTIONS_INIT;
        o.reserve_pool = argv[optind];
        o.reason = reason;
        o.labels = arg_request.n_labels > 0 ? arg_request.labels : NULL;
        o.member = arg_request.member;
        o.detach = true;
        o.max_hold_ms = DIV_ROUND_UP(hold, USEC_PER_MSEC);
        o.on_position = on_reserve_position;
        o.userdata = &last;

        /* Interrupted while waiting, slotctl dies of the signal: closing the connection withdraws. */
        r = broker_acquire(c, &o, &l);
        if (r == -EINVAL) {
                log_usage("reserve", "invalid pool, member, label or reason (not UTF-8?)");
                return EXIT_USAGE;
        }
        if (r < 0) {
                if (cli_errno_is_unreachable(r))
                        log_error_errno(r, "lost the connection to the broker: %m");
                else
                        log_error_errno(r, "reserve failed: %m");
                return cli_exit_status_from_errno(r);
        }
        if (r == BROKER_INVALID_PARAMETER) {
                const char *params = broker_client_error_parameters(c);
                const char *what = params && strstr(params, "\"member\"") ? "member"
                                   : params && strstr(params, "\"labels\"") ? "labels"
                                                                            : NULL;
                if (what)
                        log_error("reserve: pool %s has no member %s", argv[optind],
                                  streq(what, "member") ? "of that name" : "with those labels");
                if (what)
                        return EXIT_USAGE;
        }
        if (r > 0)
                return cli_log_result(c, "reserve", r, EXIT_REFUSED); /* slotctl(1): refused is 75 for every verb */

        return print_lease(c, l);
}

/* ---- release ---- */

static void release_help(const char *verb) {
        printf("slotctl release [OPTIONS…] LEASE\n\n"
               "End a lease by its id (the owner's user or root). A lease whose command still runs is\n"
               "revoked: its holder stops the command, and the slots free when it has exited.\n\n"
               "     --socket=PATH   Talk to the broker at PATH\n"
               "  -h --help          Show this help\n");
}

int verb_release(int argc, char *argv[]) {
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;
        const char *socket_path = NULL;
        int r;

        r = cli_parse_options("release", argc, argv, release_help, &(CliOptions) { .socket_path = &socket_path });
        if (r <= 0)
                return r < 0 ? EXIT_USAGE : EXIT_SUCCESS;
        if (optind + 1 != argc) {
                log_usage("release", "%s", optind >= argc ? "a lease id is missing" : "one lease id only");
                return EXIT_USAGE;
        }

        r = cli_connect(socket_path, &c);
        if (r < 0)
                return cli_exit_status_from_errno(r);
        r = broker_release(c, argv[optind]);
        if (r < 0) {
                log_error_errno(r, "release failed: %m");
                return cli_exit_status_from_errno(r);
        }
        if (r > 0)
                return cli_log_result(c, "release", r, EXIT_FAILURE);
        return EXIT_SUCCESS;
}
