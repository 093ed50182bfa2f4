/* SPDX-License-Identifier: MIT */
/* simulate-verb.c — `slotctl simulate`: its options, the scenario they describe (or the file, or the
 * history it names), and which report goes to stdout. The simulator itself is simulate.c. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli-util.h"
#include "config-files.h"
#include "replay.h"
#include "report-sim.h"
#include "report.h"
#include "scenario.h"
#include "simulate.h"

#define SWEEP_VALUES_MAX 1000

static const char *arg_limit = NULL;
static const char *arg_max_queue = NULL;
static const char *arg_queue_timeout = NULL;
static const char *arg_queue_congestion_timeout = NULL;
static const char *arg_hold = NULL;
static const char *arg_arrivals = NULL;
static const char *arg_deadline = NULL;
static const char *arg_scenario = NULL;
static const char *arg_replay = NULL;
static const char *arg_replay_pool = NULL;
static const char *arg_config = NULL;
static uint64_t arg_seed = 1;
static bool arg_per_request = false;
static bool arg_json = false;
static const char *arg_sweep_key = NULL;
static uint64_t arg_sweep_from = 0, arg_sweep_to = 0;
static const char *arg_html = NULL;

static void help(void) {
        printf("slotctl simulate [OPTIONS…]\n"
               "slotctl simulate --scenario FILE.json [OPTIONS…]\n"
               "slotctl simulate --replay history.db [--pool NAME] [--config FILE] [OPTIONS…]\n\n"
               "Run the admission engine on a virtual millisecond clock: capacity planning without a daemon.\n\n"
               "  --limit N                      Slots of the pool\n"
               "  --max-queue N                  Most requests waiting (default: no cap)\n"
               "  --queue-timeout DUR            Q: enables controlled-delay budgets\n"
               "  --queue-congestion-timeout DUR Budget while saturated (default Q/10)\n"
               "  --hold DUR                     How long every request holds its slot\n"
               "  --arrivals RATE/s:DUR[,…]      Arrival phases, back to back\n"
               "  --deadline DUR                 The client's patience: wait + hold beyond it is late\n"
               "  --scenario FILE                Pools, lanes, arrivals and requests from a JSON file\n"
               "  --replay HISTORY.DB            The requests brokerd recorded, against the pool options given\n"
               "                                 (the recorded pool's otherwise)\n"
               "  --pool NAME                    With --replay: the pool whose requests to replay\n"
               "  --config FILE                  With --replay: brokerd.conf, for the pool's members and labels\n"
               "  --seed N                       Seed of the random source (default 1)\n"
               "  --per-request                  Report every generated request too\n"
               "  --sweep KEY=A..B               One run per value of limit, max-queue or queue-timeout (s)\n"
               "  --json                         Machine-readable output\n"
               "  --html FILE                    Also draw the run as slotctl report's page ('-': stdout)\n"
               "  -h --help                      Show this help\n");
}

static int parse_u64(const char *s, uint64_t *ret) {
        char *end;

        if (!s || *s < '0' || *s > '9')
                return -EINVAL;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno != 0 || *end != '\0')
                return -EINVAL;
        *ret = v;
        return 0;
}

static int parse_sweep(const char *spec) {
        static const char *const keys[] = { "limit", "max-queue", "queue-timeout" };
        uint64_t from, to;

        _cleanup_free_ char *copy = strdup(spec);
        if (!copy)
                return log_error_errno(-ENOMEM, "--sweep: %m");
        char *eq = strchr(copy, '='), *dots = eq ? strstr(eq + 1, "..") : NULL;
        if (!eq || !dots)
                return log_usage("simulate", "--sweep: expected KEY=A..B, got \"%s\"", spec);
        *eq = '\0';
        *dots = '\0';

        const char *key = NULL;
        for (size_t i = 0; i < ELEMENTSOF(keys); i++)
                if (streq(copy, keys[i]))
                        key = keys[i];
        if (!key)
                return log_usage("simulate", "--sweep: unknown key \"%s\" (limit, max-queue or queue-timeout)", copy);
        if (parse_u64(eq + 1, &from) < 0 || parse_u64(dots + 2, &to) < 0 || from > to || to > UINT32_MAX)
                return log_usage("simulate", "--sweep: invalid range \"%s..%s\"", eq + 1, dots + 2);
        if (to - from >= SWEEP_VALUES_MAX)
                return log_usage("simulate", "--sweep: more than %d values", SWEEP_VALUES_MAX);

        arg_sweep_key = key;
        arg_sweep_from = from;
        arg_sweep_to = to;
        return 0;
}

/* Returns 1 to run, 0 after --help, -EINVAL on a usage error (already reported). */
static int parse_argv(int argc, char *argv[]) {
        enum {
                ARG_LIMIT = 0x100,
                ARG_MAX_QUEUE,
                ARG_QUEUE_TIMEOUT,
                ARG_QUEUE_CONGESTION_TIMEOUT,
                ARG_HOLD,
                ARG_ARRIVALS,
                ARG_DEADLINE,
                ARG_SCENARIO,
                ARG_SEED,
                ARG_PER_REQUEST,
                ARG_JSON,
                ARG_SWEEP,
                ARG_REPLAY,
                ARG_POOL,
                ARG_HTML,
                ARG_CONFIG,
        };
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "limit", required_argument, NULL, ARG_LIMIT },
                { "max-queue", required_argument, NULL, ARG_MAX_QUEUE },
                { "queue-timeout", required_argument, NULL, ARG_QUEUE_TIMEOUT },
                { "queue-congestion-timeout", required_argument, NULL, ARG_QUEUE_CONGESTION_TIMEOUT },
                { "hold", required_argument, NULL, ARG_HOLD },
                { "arrivals", required_argument, NULL, ARG_ARRIVALS },
                { "deadline", required_argument, NULL, ARG_DEADLINE },
                { "scenario", required_argument, NULL, ARG_SCENARIO },
                { "seed", required_argument, NULL, ARG_SEED },
                { "per-request", no_argument, NULL, ARG_PER_REQUEST },
                { "json", no_argument, NULL, ARG_JSON },
                { "sweep", required_argument, NULL, ARG_SWEEP },
                { "replay", required_argument, NULL, ARG_REPLAY },
                { "pool", required_argument, NULL, ARG_POOL },
                { "html", required_argument, NULL, ARG_HTML },
                { "config", required_argument, NULL, ARG_CONFIG },
                {}
        };
        /* The pool and traffic options of the command-line mode, which a scenario file replaces. */
        const struct {
                const char *name;
                const char **value;
        } cli_only[] = {
                { "--limit", &arg_limit },       { "--max-queue", &arg_max_queue },
                { "--queue-timeout", &arg_queue_timeout },
                { "--queue-congestion-timeout", &arg_queue_congestion_timeout },
                { "--hold", &arg_hold },         { "--arrivals", &arg_arrivals },
                { "--deadline", &arg_deadline },
        };
        int c, r;

        /* Our own messages: getopt's would be prefixed with the verb's name only. */
        opterr = 0;
        optind = 0;
        while ((c = getopt_long(argc, argv, ":h", options, NULL)) >= 0)
                switch (c) {
                case 'h':
                        help();
                        return 0;
                case ARG_LIMIT:
                        arg_limit = optarg;
                        break;
                case ARG_MAX_QUEUE:
                        arg_max_queue = optarg;
                        break;
                case ARG_QUEUE_TIMEOUT:
                        arg_queue_timeout = optarg;
                        break;
                case ARG_QUEUE_CONGESTION_TIMEOUT:
                        arg_queue_congestion_timeout = optarg;
                        break;
                case ARG_HOLD:
                        arg_hold = optarg;
                        break;
                case ARG_ARRIVALS:
                        arg_arrivals = optarg;
                        break;
                case ARG_DEADLINE:
                        arg_deadline = optarg;
                        break;
                case ARG_SCENARIO:
                        arg_scenario = optarg;
                        break;
                case ARG_REPLAY:
                        arg_replay = optarg;
                        break;
                case ARG_POOL:
                        arg_replay_pool = optarg;
                        break;
                case ARG_HTML:
                        arg_html = optarg;
                        break;
                case ARG_CONFIG:
                        arg_config = optarg;
                        break;
                case ARG_SEED:
                        if (parse_u64(optarg, &arg_seed) < 0)
                                return log_usage("simulate", "--seed: invalid number \"%s\"", optarg);
                        break;
                case ARG_PER_REQUEST:
                        arg_per_request = true;
                        break;
                case ARG_JSON:
                        arg_json = true;
                        break;
                case ARG_SWEEP:
                        r = parse_sweep(optarg);
                        if (r < 0)
                                return r;
                        break;
                case ':':
                case '?':
                default:
                        return log_usage_option("simulate", c, argv);
                }

        if (optind < argc)
                return log_usage("simulate", "unexpected argument '%s'", argv[optind]);

        for (size_t i = 0; i < ELEMENTSOF(cli_only); i++) {
                if (arg_scenario && *cli_only[i].value)
                        return log_usage("simulate", "%s cannot be combined with --scenario (set it in the scenario file)",
                                         cli_only[i].name);
        }
        if (arg_replay && (arg_scenario || arg_arrivals || arg_hold))
                return log_usage("simulate", "--replay cannot be combined with %s (the history gives the requests)",
                                 arg_scenario ? "--scenario" : arg_arrivals ? "--arrivals" : "--hold");
        if (arg_replay_pool && !arg_replay)
                return log_usage("simulate", "--pool needs --replay");
        if (arg_config && !arg_replay)
                return log_usage("simulate", "--config needs --replay (a scenario file has its own pools)");
        if (!arg_scenario && !arg_replay) {
                /* A sweep of the limit gives it, one value per run. */
                if (!arg_limit && !(arg_sweep_key && streq(arg_sweep_key, "limit")))
                        return log_usage("simulate", "--limit is missing (or give --scenario FILE or --sweep limit=A..B)");
                if (!arg_hold)
                        return log_usage("simulate", "--hold is missing (or give --scenario FILE)");
                if (!arg_arrivals)
                        return log_usage("simulate", "--arrivals is missing (or give --scenario FILE)");
        }
        if (arg_sweep_key && arg_per_request)
                return log_usage("simulate", "--per-request cannot be combined with --sweep");
        if (arg_html && arg_sweep_key)
                return log_usage("simulate", "--html cannot be combined with --sweep (it draws one run)");
        if (arg_html && streq(arg_html, "-"))
                return log_usage("simulate", "--html -: standard output has the simulation's own report");
        return 1;
}

/* The command-line mode: pool "default" from the options, and one lane "default" that waits on it. */
static int build_cli_scenario(char **error, Scenario **ret) {
        static const struct {
                const char *key;
                const char *origin;
                const char **value;
        } pool_options[] = {
                { "limit", "--limit", &arg_limit },
                { "max-queue", "--max-queue", &arg_max_queue },
                { "queue-timeout", "--queue-timeout", &arg_queue_timeout },
                { "queue-congestion-timeout", "--queue-congestion-timeout", &arg_queue_congestion_timeout },
        };
        _cleanup_(scenario_freep) Scenario *s = NULL;
        uint64_t hold, deadline = SIM_FOREVER;
        int r;

        r = parse_duration_ms(arg_hold, true, &hold);
        if (r < 0)
                return scenario_duration_error(error, "--hold", arg_hold, r);
        if (arg_deadline) {
                r = parse_duration_ms(arg_deadline, true, &deadline);
                if (r < 0)
                        return scenario_duration_error(error, "--deadline", arg_deadline, r);
        }

        r = scenario_new("slotctl simulate", &s);
        if (r < 0)
                return r;
        r = scenario_add_pool(s, "default", "--limit");
        if (r < 0)
                return r;
        for (size_t i = 0; i < ELEMENTSOF(pool_options); i++) {
                if (!*pool_options[i].value)
                        continue;
                r = scenario_add_setting(s, "pool default", pool_options[i].key, *pool_options[i].value,
                                         pool_options[i].origin, pool_options[i].origin);
                if (r < 0)
                        return r;
        }
        r = scenario_add_lane(s, "default", "the default lane");
        if (r < 0)
                return r;
        r = scenario_add_setting(s, "lane default", "pools", "default", "the default lane", "the default lane");
        if (r < 0)
                return r;
        r = scenario_add_setting(s, "lane default", "policy", "wait", "the default lane", "the default lane");
        if (r < 0)
                return r;

        char lane[] = "default", origin[] = "--arrivals";
        ScenarioTraffic traffic = {
                .lane = lane,
                .slots = 1,
                .hold_ms = hold,
                .max_wait = USEC_INFINITY,
                .origin = origin,
        };
        r = scenario_add_phases(s, arg_arrivals, &traffic, error);
        if (r < 0)
                return r;
        s->deadline_ms = deadline;
        r = scenario_finish(s, error);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(s);
        return 0;
}

/* The records that --per-request would print: an explicit request's are always printed. */
static void drop_generated_records(const Scenario *s, SimResult *r) {
        size_t n = 0;
        for (size_t i = 0; i < r->n_records; i++)
                if (scenario_request_name(s, r->records[i].id))
                        r->records[n++] = r->records[i];
        r->n_records = n;
}

static void configs_free(BrokerConfig **configs, size_t n) {
        for (size_t i = 0; i < n; i++)
                conf_free(configs[i]);
        free(configs);
}

/* Returns the exit status. */
/* The text of --sweep's value v for its key ("" without --sweep): queue-timeout's in seconds. */
static void sweep_value(char *buf, size_t size, uint64_t v) {
        if (arg_sweep_key)
                snprintf(buf, size, "%" PRIu64 "%s", v, streq(arg_sweep_key, "queue-timeout") ? "s" : "");
}

static int run(void) {
        _cleanup_(scenario_freep) Scenario *s = NULL;
        _cleanup_free_ char *error = NULL;
        _cleanup_free_ SimSweepRow *rows = NULL;
        BrokerConfig **configs = NULL;
        size_t n_values = arg_sweep_key ? (size_t) (arg_sweep_to - arg_sweep_from + 1) : 1, n_configs = 0;
        int r, ret = EXIT_FAILURE;

        if (arg_scenario)
                r = scenario_load_file(arg_scenario, &error, &s);
        else if (arg_replay) {
                _cleanup_(replay_info_done) ReplayInfo info = {};
                _cleanup_(conf_freep) BrokerConfig *config = NULL;
                if (arg_config) {
                        _cleanup_(conf_errors_done) ConfErrors errors = {};
                        r = config_load(arg_config, &config, &errors);
                        if (r == -ENOMEM) {
                                log_error_errno(r, "--config: %m");
                                return EXIT_FAILURE;
                        }
                        if (r < 0) {
                                conf_errors_print(&errors, stderr);
                                log_error("--config: '%s' is not a valid brokerd configuration", arg_config);
                                return EXIT_USAGE;
                        }
                }
                r = replay_load(&(ReplayOptions) {
                                        .path = arg_replay,
                                        .pool = arg_replay_pool,
                                        .limit = arg_limit,
                                        .max_queue = arg_max_queue,
                                        .queue_timeout = arg_queue_timeout,
                                        .queue_congestion_timeout = arg_queue_congestion_timeout,
                                        .deadline = arg_deadline,
                                        .sweep_key = arg_sweep_key,
                                        .config = config,
                                        .config_path = arg_config,
                                },
                                &error, &s, &info);
                if (r >= 0)
                        replay_info_print(&info, stderr);
        } else
                r = build_cli_scenario(&error, &s);
        if (r == -EINVAL) {
                if (error)
                        log_error("%s", error);
                return EXIT_USAGE;
        }
        if (r < 0) {
                log_error_errno(r, "Failed to prepare the simulation: %m");
                return EXIT_FAILURE;
        }

        /* Every configuration is checked before anything runs, so a bad value prints nothing on stdout. */
        configs = calloc(n_values, sizeof(BrokerConfig *));
        if (!configs) {
                log_error_errno(-ENOMEM, "Failed to prepare the simulation: %m");
                return EXIT_FAILURE;
        }
        for (; n_configs < n_values; n_configs++) {
                char value[32] = "";
                uint64_t v = arg_sweep_from + n_configs;

                sweep_value(value, sizeof value, v);
                r = scenario_build_config(s, arg_sweep_key, arg_sweep_key ? value : NULL, &error, &configs[n_configs]);
                if (r == -EINVAL) {
                        log_error("%s", error ?: "invalid configuration");
                        ret = EXIT_USAGE;
                        goto finish;
                }
                if (r < 0) {
                        log_error_errno(r, "Failed to build the configuration: %m");
                        goto finish;
                }
        }

        if (arg_sweep_key) {
                rows = calloc(n_values, sizeof(SimSweepRow));
                if (!rows) {
                        log_error_errno(-ENOMEM, "Failed to simulate: %m");
                        goto finish;
                }
        }

        SimOptions options = {
                .seed = arg_seed,
                .per_request = arg_per_request || arg_html, /* the page draws every request */
        };
        for (size_t i = 0; i < n_values; i++) {
                _cleanup_(sim_result_freep) SimResult *result = NULL;
                char value[32] = "";

                /* The scenario's reloads keep the swept value (as built above). */
                sweep_value(value, sizeof value, arg_sweep_from + i);
                options.config_key = arg_sweep_key;
                options.config_value = arg_sweep_key ? value : NULL;
                r = sim_run(s, configs[i], &options, &result);
                if (r == -E2BIG || r == -ENOBUFS) {
                        _cleanup_free_ char *text = sim_bound_text(r);
                        if (!text)
                                log_error_errno(-ENOMEM, "Failed to simulate: %m");
                        else {
                                log_error("%s", text);
                                ret = EXIT_USAGE;
                        }
                        goto finish;
                }
                if (r < 0) {
                        log_error_errno(r, "Failed to simulate: %m");
                        goto finish;
                }
                if (arg_html) {
                        _cleanup_(report_freep) Report *report = NULL;
                        r = report_from_simulation(s, result, &report);
                        if (r < 0) {
                                log_error_errno(r, "Failed to draw the simulation: %m");
                                goto finish;
                        }
                        r = report_write_file(report, &(ReportHtmlOptions) { .source = "slotctl simulate" }, arg_html);
                        if (r < 0)
                                goto finish;
                }
                if (arg_replay && !arg_per_request)
                        replay_result_trim(result); /* thousands of recorded requests: only on request */
                else if (arg_html && !arg_per_request)
                        drop_generated_records(s, result); /* kept for the page only */
                if (!arg_sweep_key) {
                        if (arg_json)
                                sim_print_json(s, result, stdout);
                        else
                                sim_print_text(s, result, stdout);
                        continue;
                }
                sim_sweep_row_init(&rows[i], arg_sweep_from + i, result);
        }
        if (arg_sweep_key) {
                if (arg_json)
                        sim_sweep_print_json(rows, n_values, stdout);
                else
                        sim_sweep_print_text(arg_sweep_key, rows, n_values, stdout);
        }

        if (fflush(stdout) != 0 || ferror(stdout)) {
                log_error_errno(negative_errno(), "Failed to write the report: %m");
                goto finish;
        }
        ret = EXIT_SUCCESS;
finish:
        configs_free(configs, n_configs);
        return ret;
}

int verb_simulate(int argc, char *argv[]) {
        int r;

        r = parse_argv(argc, argv);
        if (r < 0)
                return r == -ENOMEM ? EXIT_FAILURE : EXIT_USAGE;
        if (r == 0)
                return EXIT_SUCCESS;
        return run();
}
