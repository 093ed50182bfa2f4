/* SPDX-License-Identifier: MIT */
/* slotctl.c — the entry point: global options, then the verb. Each verb lives in its own file as
 * `int verb_NAME(int argc, char *argv[])`, gets argv from its own name on, and returns the exit status
 * (SPEC §6: 64 for usage errors, 75 refused, …). */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sysexits.h>

#include "config.h"
#include "fs-util.h"
#include "macro.h"

/* Adding a verb is one line here (and its file in meson.build). */
#define SLOTCTL_VERBS(X) \
        X(run, "Acquire a slot, run a command with it, release it") \
        X(acquire, "Acquire a detached lease (--detach --max-hold) and print its id") \
        X(release, "End a lease by its id") \
        X(reserve, "Reserve a member for a person, ahead of every waiting job") \
        X(status, "Show pools, their holders and waiters") \
        X(history, "Show recorded decisions") \
        X(metrics, "Print the metrics (Prometheus text)") \
        X(drain, "Stop granting from a pool or one of its members") \
        X(undrain, "Grant from a drained pool or member again") \
        X(quarantine, "Quarantine a member: only health lanes get it") \
        X(restore, "Restore a quarantined member") \
        X(cancel, "Refuse matching waiting requests") \
        X(reload, "Apply the configuration again, and report its errors") \
        X(simulate, "Run the admission engine on a virtual clock (capacity planning)") \
        X(report, "Draw history.db's decisions as a self-contained HTML page")

#define DECLARE_VERB(name, summary) int verb_##name(int argc, char *argv[]);
SLOTCTL_VERBS(DECLARE_VERB)

typedef struct Verb {
        const char *name;
        int (*run)(int argc, char *argv[]);
        const char *summary;
} Verb;

#define VERB_ENTRY(name, summary) { #name, verb_##name, summary },
static const Verb verbs[] = { SLOTCTL_VERBS(VERB_ENTRY) };

static void help(void) {
        printf("slotctl [--help|--version] VERB [OPTIONS…]\n\n"
               "Counted slots for CI lanes, from brokerd.\n\n"
               "Verbs:\n");
        for (size_t i = 0; i < ELEMENTSOF(verbs); i++)
                printf("  %-10s %s\n", verbs[i].name, verbs[i].summary);
        printf("\n'slotctl VERB --help' describes a verb's options.\n");
}

int main(int argc, char *argv[]) {
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, 'V' },
                {}
        };
        int c;

        /* A closed stdout must not become the socket's number (what slotctl prints would go to brokerd). */
        if (stdio_ensure_open() < 0)
                return EX_OSERR;

        /* jansson seeds its hash function on first use by opening and reading /dev/urandom (three system
         * calls on every `slotctl run`); one getrandom() gives it a seed as random. 0 lets it seed itself. */
        size_t seed = 0;
        if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t) sizeof seed)
                seed = 0;
        json_object_seed(seed);

        /* "+": stop at the verb, whose options are its own. */
        opterr = 0;
        while ((c = getopt_long(argc, argv, "+h", options, NULL)) >= 0)
                switch (c) {
                case 'h':
                        help();
                        return EXIT_SUCCESS;
                case 'V':
                        printf("slotctl %s\n", PACKAGE_VERSION);
                        return EXIT_SUCCESS;
                default:
                        fprintf(stderr, "slotctl: unknown option '%s' (see slotctl --help)\n", argv[optind - 1]);
                        return EX_USAGE;
                }

        if (optind >= argc) {
                fprintf(stderr, "slotctl: a verb is missing (see slotctl --help)\n");
                return EX_USAGE;
        }
        for (size_t i = 0; i < ELEMENTSOF(verbs); i++)
                if (streq(argv[optind], verbs[i].name))
                        return verbs[i].run(argc - optind, argv + optind);

        fprintf(stderr, "slotctl: unknown verb '%s' (see slotctl --help)\n", argv[optind]);
        return EX_USAGE;
}
