/* SPDX-License-Identifier: MIT */
/* main.c — brokerd: command line, configuration check, and the loop. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "config-files.h"
#include "config.h"
#include "fs-util.h"
#include "log.h"
#include "manager.h"

static const char *arg_config = NULL;
static const char *arg_socket = NULL;
static const char *arg_state_directory = NULL;
static bool arg_check_config = false;

static void help(void) {
        printf("Usage: brokerd [OPTIONS]\n\n"
               "Grants named, counted slots to CI lanes over a Varlink socket.\n\n"
               "  -c --config=PATH           Read PATH instead of " CONFIG_MAIN_PATH " (drop-ins: PATH.d/)\n"
               "     --socket=PATH           Listen on PATH unless systemd passed a socket\n"
               "     --state-directory=DIR   Keep history and leases in DIR\n"
               "     --check-config          Validate the configuration, print it, and exit\n"
               "  -h --help                  Show this help\n"
               "     --version               Show the version\n\n"
               "See brokerd(8) and brokerd.conf(5).\n");
}

static int parse_argv(int argc, char *argv[]) {
        enum { ARG_SOCKET = 0x100, ARG_STATE_DIRECTORY, ARG_CHECK_CONFIG, ARG_VERSION };
        static const struct option options[] = {
                { "config", required_argument, NULL, 'c' },
                { "socket", required_argument, NULL, ARG_SOCKET },
                { "state-directory", required_argument, NULL, ARG_STATE_DIRECTORY },
                { "check-config", no_argument, NULL, ARG_CHECK_CONFIG },
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, ARG_VERSION },
                {},
        };
        int c;
        while ((c = getopt_long(argc, argv, "c:h", options, NULL)) >= 0)
                switch (c) {
                case 'c':
                        arg_config = optarg;
                        break;
                case ARG_SOCKET:
                        arg_socket = optarg;
                        break;
                case ARG_STATE_DIRECTORY:
                        arg_state_directory = optarg;
                        break;
                case ARG_CHECK_CONFIG:
                        arg_check_config = true;
                        break;
                case 'h':
                        help();
                        return 0;
                case ARG_VERSION:
                        printf("brokerd %s\n", PACKAGE_VERSION);
                        return 0;
                default:
                        return -EINVAL;
                }
        if (optind < argc) {
                log_error("Unexpected argument: %s", argv[optind]);
                return -EINVAL;
        }
        return 1;
}

static int check_config(void) {
        _cleanup_(conf_freep) BrokerConfig *c = NULL;
        ConfErrors errors = {};
        int r = config_load(arg_config, &c, &errors);
        if (r < 0) {
                conf_errors_print(&errors, stderr);
                conf_errors_done(&errors);
                return r;
        }
        conf_dump(c, stdout);
        /* Names are brokerd's to resolve, on its host: this check may run elsewhere (a repository's CI), so an
         * unknown one is a warning here, where a start or a reload on this host refuses it. */
        r = manager_check_names(c, &errors);
        for (size_t i = 0; r != -ENOMEM && i < errors.n_errors; i++) {
                _cleanup_free_ char *text = conf_error_to_string(&errors.errors[i]);
                if (!text)
                        r = -ENOMEM;
                else
                        fprintf(stderr, "warning: %s (brokerd refuses this configuration on this host)\n", text);
        }
        conf_errors_done(&errors);
        return r == -ENOMEM ? log_oom() : 0;
}

int main(int argc, char *argv[]) {
        _cleanup_(manager_freep) Manager *m = NULL;
        int r;

        /* Nowhere to say it when this fails: stderr is what it would have opened. */
        if (stdio_ensure_open() < 0)
                return EXIT_FAILURE;
        log_setup();
        r = parse_argv(argc, argv);
        if (r <= 0)
                return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
        if (arg_check_config)
                return check_config() < 0 ? EXIT_FAILURE : EXIT_SUCCESS;

        r = manager_new(&(ManagerOptions) { .config_path = arg_config,
                                            .socket_path = arg_socket,
                                            .state_directory = arg_state_directory },
                        &m);
        if (r < 0)
                return EXIT_FAILURE;
        r = manager_start(m);
        if (r < 0)
                return EXIT_FAILURE;
        r = manager_run(m);
        if (r < 0) {
                log_error_errno(r, "Event loop failed: %m");
                return EXIT_FAILURE;
        }
        return EXIT_SUCCESS;
}
