/* SPDX-License-Identifier: MIT */
/* status.c — the verbs that show data: slotctl status (pools, holders, waiters), history, metrics. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli-util.h"

/* Options every data verb takes; parse_common() handles them and rejects the rest. */
static const char *arg_socket = NULL;
static bool arg_json = false;

#define USAGE_BAR_WIDTH_MAX 20
#define JOB_COLUMN_MAX 40

static json_int_t int_member(json_t *o, const char *key, json_int_t fallback) {
        json_t *v = json_object_get(o, key);
        return json_is_integer(v) ? json_integer_value(v) : fallback;
}

static const char *string_member(json_t *o, const char *key) {
        return json_string_value(json_object_get(o, key));
}

static const char *duration_member(char buf[static CLI_DURATION_MAX], json_t *o, const char *key, const char *null) {
        json_t *v = json_object_get(o, key);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
                return null;
        return cli_format_duration_ms(buf, (uint64_t) json_integer_value(v));
}

/* A job label cut for a column: URLs are long, their ends say the most. */
static const char *job_column(char buf[static JOB_COLUMN_MAX + 8], const char *job) {
        if (!job)
                return "-";
        size_t n = strlen(job);
        if (n <= JOB_COLUMN_MAX)
                return job;
        const char *tail = job + n - (JOB_COLUMN_MAX - 3);
        while ((*tail & 0xc0) == 0x80)
                tail++; /* not in the middle of a UTF-8 sequence */
        snprintf(buf, JOB_COLUMN_MAX + 8, "…%s", tail);
        return buf;
}

static void print_usage_bar(json_int_t in_use, json_int_t limit) {
        int width = (int) MIN(MAX(limit, (json_int_t) 1), (json_int_t) USAGE_BAR_WIDTH_MAX);
        int filled = limit > 0 ? (int) MIN((in_use * width + limit - 1) / limit, (json_int_t) width) : 0;
        putchar('[');
        for (int i = 0; i < width; i++)
                putchar(i < filled ? '#' : '-');
        putchar(']');
}

static void print_slots(json_t *lease) {
        json_t *members = json_object_get(lease, "members"), *slots = json_object_get(lease, "slots");
        json_t *list = json_is_array(members) ? members : slots;
        size_t i;
        json_t *v;
        char buf[64];
        int width = 0;

        json_array_foreach(list, i, v) {
                if (json_is_string(v))
                        snprintf(buf, sizeof buf, "%s", json_string_value(v));
                else
                        snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
                width += printf("%s%s", i > 0 ? "," : "", buf);
        }
        printf("%*s", MAX(0, 8 - width), "");
}

/* The title of print_slots()'s column: what a lease holds is slot indices, or members by name (never
 * the number of slots, which is the waiters' SLOTS). */
static const char *slots_title(json_t *lease) {
        return json_is_array(json_object_get(lease, "members")) ? "MEMBER" : "INDEX";
}

/* The share of an all-or-nothing lease in pool name (Lease.also), or NULL. */
static json_t *lease_also_in(json_t *lease, const char *name) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(lease, "also"), i, v)
                if (streq_ptr(string_member(v, "pool"), name))
                        return v;
        return NULL;
}

static void print_time(char when[static 64], json_int_t usec);

/* The leases holding slots of pool name, as a table under its pool line; under a reservation's row (SPEC §3.6)
 * who, until when and why, its reason whole. */
static void print_holders(json_t *holders, const char *name) {
        bool header = false;
        size_t i;
        json_t *v;

        json_array_foreach(holders, i, v) {
                json_t *lease = json_object_get(v, "lease");
                /* An all-or-nothing lease is listed under each pool of its set, with its slots there. */
                json_t *share = streq_ptr(string_member(lease, "pool"), name) ? lease : lease_also_in(lease, name);
                if (!share)
                        continue;
                char job[JOB_COLUMN_MAX + 8], held[CLI_DURATION_MAX];
                if (!header) {
                        printf("  %-32s %-10s %-8s %-6s %-8s %-8s %-8s %-10s %s\n", "LEASE", "LANE", slots_title(share), "UID", "PID",
                               "COMMAND", "HELD", "STATE", "JOB");
                        header = true;
                }
                printf("  %-32s %-10s ", string_member(lease, "id") ?: "?", string_member(lease, "lane") ?: "?");
                print_slots(share);
                json_int_t command = int_member(lease, "commandPid", 0);
                char command_buf[32] = "-";
                if (command > 0)
                        snprintf(command_buf, sizeof command_buf, "%" JSON_INTEGER_FORMAT, command);
                printf(" %-6" JSON_INTEGER_FORMAT " %-8" JSON_INTEGER_FORMAT " %-8s %-8s %-10s %s\n", int_member(lease, "uid", -1),
                       int_member(lease, "pid", 0), command_buf, duration_member(held, v, "heldMs", "?"),
                       json_is_true(json_object_get(lease, "detached")) && streq_ptr(string_member(v, "state"), "held")
                               ? "detached"
                               : string_member(v, "state") ?: "?",
                       job_column(job, string_member(lease, "job")));
                if (streq_ptr(string_member(lease, "lane"), "@reserve")) {
                        char until[64];
                        print_time(until, int_member(lease, "expiresAt", -1));
                        printf("    reserved by uid %" JSON_INTEGER_FORMAT " until %s: %s\n", int_member(lease, "uid", -1),
                               until, string_member(lease, "job") ?: "");
                }
        }
}

/* The requests waiting for pool name, as a table under its pool line. */
static void print_waiters(json_t *waiters, const char *name) {
        bool header = false;
        size_t i;
        json_t *v;

        json_array_foreach(waiters, i, v) {
                /* A set's waiter (also=) is listed under each pool it waits in, with the furthest place and
                 * the slots it wants there (alsoSlots; absent from an older brokerd: its slots). */
                bool in_set = false;
                size_t k;
                json_int_t slots = int_member(v, "slots", 1);
                json_t *p, *also = json_object_get(v, "also");
                json_array_foreach(also, k, p)
                        if (!in_set && streq_ptr(json_string_value(p), name)) {
                                in_set = true;
                                json_t *n = json_array_get(json_object_get(v, "alsoSlots"), k);
                                if (json_is_integer(n))
                                        slots = json_integer_value(n);
                        }
                bool chosen = streq_ptr(string_member(v, "pool"), name);
                if (!in_set && !chosen)
                        continue;
                char job[JOB_COLUMN_MAX + 8], waited[CLI_DURATION_MAX], budget[CLI_DURATION_MAX];
                /* What it asks of the members (SPEC §3.5): why it may wait while a member is free. Its own
                 * labels, then its lane's labels=, and a member choose in the chosen pool only, not in its
                 * also= pools. */
                char wants[512] = "";
                json_t *label;
                for (const char *const *field = (const char *const[]) { "labels", "laneLabels", NULL }; *field; field++)
                        json_array_foreach(chosen ? json_object_get(v, *field) : NULL, k, label)
                                if (json_is_string(label))
                                        snprintf(wants + strlen(wants), sizeof wants - strlen(wants), "%s%s",
                                                 *wants ? " " : " (wants ", json_string_value(label));
                if (chosen && string_member(v, "member"))
                        snprintf(wants + strlen(wants), sizeof wants - strlen(wants), "%s%s", *wants ? " member " : " (wants member ",
                                 string_member(v, "member"));
                if (*wants)
                        snprintf(wants + strlen(wants), sizeof wants - strlen(wants), ")");
                if (json_array_size(also) > 0) {
                        snprintf(wants + strlen(wants), sizeof wants - strlen(wants), " (all of %s",
                                 string_member(v, "pool") ?: "?");
                        json_array_foreach(also, k, p)
                                if (json_is_string(p))
                                        snprintf(wants + strlen(wants), sizeof wants - strlen(wants), " %s",
                                                 json_string_value(p));
                        snprintf(wants + strlen(wants), sizeof wants - strlen(wants), ")");
                }
                if (!header) {
                        printf("  %-8s %-10s %-5s %-6s %-8s %-8s %-10s %s\n", "PLACE", "LANE", "SLOTS", "UID", "PID", "WAITED",
                               "BUDGET", "JOB");
                        header = true;
                }
                printf("  %-8" JSON_INTEGER_FORMAT " %-10s %-5" JSON_INTEGER_FORMAT " %-6" JSON_INTEGER_FORMAT
                       " %-8" JSON_INTEGER_FORMAT " %-8s %-10s %s%s\n",
                       int_member(v, "position", 0), string_member(v, "lane") ?: "?", slots,
                       int_member(v, "uid", -1), int_member(v, "pid", 0), duration_member(waited, v, "waitedMs", "?"),
                       duration_member(budget, v, "budgetMs", "unbounded"), job_column(job, string_member(v, "job")),
                       wants);
        }
}

/* Behind Sentinels: the primary in use, the failovers this node saw, and how long ago a majority of the
 * Sentinels last confirmed the primary, on a line of its own. */
static void print_primary(json_t *backend) {
        const char *primary = string_member(backend, "primary");
        json_int_t failovers = int_member(backend, "failovers", -1);
        json_int_t last = int_member(backend, "lastFailoverAt", 0);
        json_int_t confirmed_ago = int_member(backend, "confirmedAgoMs", -1);
        char when[32] = "", confirmed[64] = "; not confirmed by a majority of the Sentinels";

        if (!primary && failovers < 0)
                return;
        if (last > 0) {
                time_t t = (time_t) (last / 1000000);
                struct tm tm;
                if (localtime_r(&t, &tm))
                        (void) strftime(when, sizeof when, ", the last at %Y-%m-%d %H:%M:%S", &tm);
        }
        if (confirmed_ago >= 0)
                snprintf(confirmed, sizeof confirmed, "; confirmed %" JSON_INTEGER_FORMAT ".%01" JSON_INTEGER_FORMAT
                         " s ago", confirmed_ago / 1000, confirmed_ago % 1000 / 100);
        printf("  sentinel: primary %s, %" JSON_INTEGER_FORMAT " failover%s seen%s%s\n", primary ?: "not named yet",
               failovers < 0 ? 0 : failovers, failovers == 1 ? "" : "s", when, confirmed);
}

static void print_backend_state(json_t *backend, json_int_t limit) {
        json_int_t age = int_member(backend, "snapshotAgeMs", -1);
        char as_of[64] = "";
        if (age >= 0)
                snprintf(as_of, sizeof as_of, "; other nodes as of %" JSON_INTEGER_FORMAT ".%01" JSON_INTEGER_FORMAT " s ago",
                         age / 1000, age % 1000 / 100);
        if (json_is_true(json_object_get(backend, "up"))) {
                printf("  shared: backend up, %" JSON_INTEGER_FORMAT " node%s, round trip %" JSON_INTEGER_FORMAT " ms%s\n",
                       int_member(backend, "nodes", 0), int_member(backend, "nodes", 0) == 1 ? "" : "s",
                       int_member(backend, "rttMs", 0), as_of);
                return;
        }
        printf("  shared: refused here (%s%s)", string_member(backend, "unavailable") ?: "backend", as_of);
        json_t *keys = json_object_get(backend, "differingKeys");
        size_t i;
        json_t *v;
        if (json_array_size(keys) > 0) {
                printf(", these keys differ from the agreed rules:");
                json_array_foreach(keys, i, v)
                        printf(" %s", json_string_value(v) ?: "?");
        }
        json_int_t agreed = int_member(backend, "limit", -1);
        if (agreed >= 0 && agreed != limit)
                printf("; the agreed limit is %" JSON_INTEGER_FORMAT ", this node's %" JSON_INTEGER_FORMAT, agreed, limit);
        putchar('\n');
}

/* backend-min-replicas: what a grant waits for, and what the last WAIT found. */
static void print_min_replicas(json_t *backend) {
        json_int_t wanted = int_member(backend, "minReplicas", 0), acked = int_member(backend, "replicasAcked", -1);
        if (wanted <= 0)
                return;
        printf("  replicas: a grant waits for %" JSON_INTEGER_FORMAT ", ", wanted);
        if (acked < 0)
                printf("none asked yet\n");
        else
                printf("%" JSON_INTEGER_FORMAT " acknowledged the last%s\n", acked, acked < wanted ? " (too few)" : "");
}

/* How this node sees a shared pool's backend (Status "backend"), under its pool line. */
static void print_backend(json_t *backend, json_int_t limit) {
        if (!json_is_object(backend))
                return;
        print_backend_state(backend, limit);
        print_primary(backend);
        print_min_replicas(backend);
}

/* Other nodes' leases and waiters in shared pool name (Status otherHolders/otherWaiters), by node name.
 * Another node's clients are not this one's to show: no lease id, uid, pid or job. */
static void print_other_nodes(json_t *holders, json_t *waiters, const char *name) {
        bool header = false;
        size_t i;
        json_t *v;
        char held[CLI_DURATION_MAX], waited[CLI_DURATION_MAX];

        json_array_foreach(holders, i, v) {
                if (!streq_ptr(string_member(v, "pool"), name))
                        continue;
                if (!header) {
                        printf("  %-20s %-10s %-8s %-20s %s\n", "HELD ON NODE", "LANE", slots_title(v), "TOKEN", "HELD");
                        header = true;
                }
                printf("  %-20s %-10s ", string_member(v, "node") ?: "?", string_member(v, "lane") ?: "?");
                print_slots(v);
                printf(" %-20" JSON_INTEGER_FORMAT " %s\n", int_member(v, "token", 0), duration_member(held, v, "heldMs", "?"));
        }
        header = false;
        json_array_foreach(waiters, i, v) {
                if (!streq_ptr(string_member(v, "pool"), name))
                        continue;
                if (!header) {
                        printf("  %-8s %-20s %-10s %-5s %s\n", "PLACE", "ON NODE", "LANE", "SLOTS", "WAITED");
                        header = true;
                }
                printf("  %-8" JSON_INTEGER_FORMAT " %-20s %-10s %-5" JSON_INTEGER_FORMAT " %s\n", int_member(v, "position", 0),
                       string_member(v, "node") ?: "?", string_member(v, "lane") ?: "?", int_member(v, "slots", 1),
                       duration_member(waited, v, "waitedMs", "?"));
        }
}

/* SPEC §3.6: "quarantined since … by job … (exit 3)", one line per member. */
static void print_quarantined(json_t *list) {
        size_t i;
        json_t *q;
        json_array_foreach(list, i, q) {
                char when[64] = "?", job[JOB_COLUMN_MAX + 8];
                json_int_t since = int_member(q, "since", -1), status = int_member(q, "exitStatus", -1);
                time_t t = (time_t) (since / 1000000);
                struct tm tm;
                if (since >= 0 && localtime_r(&t, &tm))
                        (void) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
                printf("  %s quarantined since %s", string_member(q, "member") ?: "?", when);
                if (string_member(q, "job"))
                        printf(" %s %s", status >= 0 ? "by job" : "by", job_column(job, string_member(q, "job")));
                if (status >= 0)
                        printf(" (exit %" JSON_INTEGER_FORMAT ")", status);
                if (string_member(q, "reason"))
                        printf(": %s", string_member(q, "reason"));
                putchar('\n');
        }
}

static void print_time(char when[static 64], json_int_t usec) {
        time_t t = (time_t) (usec / 1000000);
        struct tm tm;
        strcpy(when, "?");
        if (usec >= 0 && localtime_r(&t, &tm))
                (void) strftime(when, 64, "%Y-%m-%d %H:%M:%S", &tm);
}

/* SPEC §3.6: "drained since … by uid 0 until …: reason". */
static void print_drain(json_t *d) {
        char since[64], until[64];
        print_time(since, int_member(d, "since", -1));
        printf("  %s drained since %s", string_member(d, "member") ?: "pool", since);
        if (string_member(d, "by"))
                printf(" by %s", string_member(d, "by"));
        if (json_is_integer(json_object_get(d, "until"))) {
                print_time(until, int_member(d, "until", -1));
                printf(" until %s", until);
        }
        if (string_member(d, "reason"))
                printf(": %s", string_member(d, "reason"));
        putchar('\n');
}

static void print_pool(json_t *pool, json_t *reply) {
        const char *name = string_member(pool, "name") ?: "?";
        json_int_t limit = int_member(pool, "limit", 0), in_use = int_member(pool, "inUse", 0);
        json_int_t waiting = int_member(pool, "waiting", 0), max_queue = int_member(pool, "maxQueue", -1);
        size_t i;
        json_t *v;

        /* A shared pool's line counts every node (backend.inUse and waiting, from the backend's last reply),
         * then this node's own part; the other nodes' entries are listed below. */
        json_t *backend = json_object_get(pool, "backend");
        json_int_t shown_in_use = json_is_object(backend) ? int_member(backend, "inUse", in_use) : in_use;
        json_int_t shown_waiting = json_is_object(backend) ? int_member(backend, "waiting", waiting) : waiting;
        /* Against the limit Redis enforces: on a node whose rules differ, not its own (said under the line). */
        json_int_t shown_limit = json_is_object(backend) ? int_member(backend, "limit", limit) : limit;
        printf("%-10s ", name);
        print_usage_bar(shown_in_use, shown_limit);
        printf("  %" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT " in use, %" JSON_INTEGER_FORMAT " waiting", shown_in_use,
               shown_limit, shown_waiting);
        if (max_queue >= 0)
                printf(" (max %" JSON_INTEGER_FORMAT ")", max_queue);
        if (json_is_object(backend))
                printf(", here %" JSON_INTEGER_FORMAT " in use, %" JSON_INTEGER_FORMAT " waiting", in_use, waiting);
        if (json_is_true(json_object_get(pool, "congested")))
                printf(", congested");
        if (json_is_true(json_object_get(pool, "drained")))
                printf(", drained");
        json_t *drained_members = json_object_get(pool, "drainedMembers");
        if (json_array_size(drained_members) > 0) {
                printf(", drained members:");
                json_array_foreach(drained_members, i, v)
                        printf(" %s", json_string_value(v) ?: "?");
        }
        json_int_t cooldown = int_member(pool, "cooldownMs", 0);
        if (cooldown > 0) {
                char d[CLI_DURATION_MAX];
                printf(", cooldown %s", cli_format_duration_ms(d, (uint64_t) cooldown));
        }
        json_t *resting = json_object_get(pool, "resting");
        if (json_array_size(resting) > 0) {
                printf(", resting:");
                json_array_foreach(resting, i, v) {
                        char left[CLI_DURATION_MAX];
                        json_int_t ms = int_member(v, "leftMs", 0);
                        cli_format_duration_ms(left, ms > 0 ? (uint64_t) ms : 0);
                        if (string_member(v, "member"))
                                printf(" %s", string_member(v, "member"));
                        else
                                printf(" #%" JSON_INTEGER_FORMAT, int_member(v, "slot", 0));
                        printf(" (%s left)", left);
                }
        }
        putchar('\n');
        if (json_is_object(json_object_get(pool, "drain")))
                print_drain(json_object_get(pool, "drain"));
        json_array_foreach(json_object_get(pool, "memberDrains"), i, v)
                print_drain(v);
        print_quarantined(json_object_get(pool, "quarantined"));
        print_backend(backend, limit);
        print_holders(json_object_get(reply, "holders"), name);
        print_waiters(json_object_get(reply, "waiters"), name);
        print_other_nodes(json_object_get(reply, "otherHolders"), json_object_get(reply, "otherWaiters"), name);
}

static bool pool_is_listed(json_t *pools, const char *name) {
        size_t i;
        json_t *pool;
        json_array_foreach(pools, i, pool)
                if (streq_ptr(string_member(pool, "name"), name))
                        return true;
        return false;
}

static const char *holder_pool(json_t *holder) {
        return string_member(json_object_get(holder, "lease"), "pool");
}

/* A reload removed the pool, and leases of it are still held (they end when their holders are done,
 * SPEC §3.4): the reply's pools have no line for it, but its holders still use what it stood for. One
 * section per such pool, at its first holder; there are as many holders as slots at most. */
static void print_removed_pools(json_t *pools, json_t *holders, json_t *waiters) {
        size_t i, j;
        json_t *v, *w;

        json_array_foreach(holders, i, v) {
                const char *name = holder_pool(v);
                if (!name || pool_is_listed(pools, name))
                        continue;
                size_t n = 0;
                bool first = true;
                json_array_foreach(holders, j, w)
                        if (streq_ptr(holder_pool(w), name)) {
                                first = first && j >= i;
                                n++;
                        }
                if (!first)
                        continue;
                printf("\n%-10s removed from the configuration, %zu lease%s still held\n", name, n, n == 1 ? "" : "s");
                print_holders(holders, name);
                print_waiters(waiters, name);
        }
}

/* --socket, --json and --help, and no argument; extra options come from the caller's table. */
static int parse_common(const char *verb, void (*help)(const char *verb), int argc, char *argv[],
                        const struct option *extra, int (*on_extra)(int c, const char *value)) {
        int r = cli_parse_options(verb, argc, argv, help,
                                  &(CliOptions) { .socket_path = &arg_socket, .json = &arg_json, .extra = extra,
                                                  .on_extra = on_extra });
        if (r <= 0)
                return r;
        if (optind < argc)
                return log_usage(verb, "unexpected argument '%s'", argv[optind]);
        return 1;
}

static void status_help(const char *verb) {
        printf("slotctl status [OPTIONS…]\n\n"
               "Show every pool with its usage, the leases that hold its slots and the requests waiting.\n\n"
               "     --json          Print the broker's Status reply as it is\n"
               "     --socket=PATH   Talk to the broker at PATH\n"
               "  -h --help          Show this help\n");
}

int verb_status(int argc, char *argv[]) {
        _cleanup_(json_decrefp) json_t *reply = NULL;
        int r;

        r = parse_common("status", status_help, argc, argv, NULL, NULL);
        if (r <= 0)
                return r < 0 ? EXIT_USAGE : EXIT_SUCCESS;
        r = cli_call(arg_socket, "status", "io.slotbroker.Status", NULL, &reply);
        if (r != 0)
                return r;
        if (arg_json) {
                cli_print_json(reply, stdout);
                return EXIT_SUCCESS;
        }
        if (cli_json_make_printable(reply) < 0) {
                log_error("Out of memory.");
                return EXIT_FAILURE;
        }

        json_t *pools = json_object_get(reply, "pools"), *holders = json_object_get(reply, "holders"),
               *waiters = json_object_get(reply, "waiters");
        size_t i;
        json_t *pool;
        const char *unavailable = json_string_value(json_object_get(reply, "unavailable"));
        if (unavailable)
                printf("No lease is granted now: %s (brokerd.conf(5), lease-persistence=).\n\n", unavailable);
        if (json_array_size(pools) == 0)
                printf("No pools are configured.\n");
        json_array_foreach(pools, i, pool) {
                if (i > 0)
                        putchar('\n');
                print_pool(pool, reply);
        }
        print_removed_pools(pools, holders, waiters);
        return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* ---- metrics ---- */

static void metrics_help(const char *verb) {
        printf("slotctl metrics [OPTIONS…]\n\n"
               "Print the broker's metrics in the Prometheus text format.\n\n"
               "     --json          Print the broker's Metrics reply as it is\n"
               "     --socket=PATH   Talk to the broker at PATH\n"
               "  -h --help          Show this help\n");
}

int verb_metrics(int argc, char *argv[]) {
        _cleanup_(json_decrefp) json_t *reply = NULL;
        int r;

        r = parse_common("metrics", metrics_help, argc, argv, NULL, NULL);
        if (r <= 0)
                return r < 0 ? EXIT_USAGE : EXIT_SUCCESS;
        r = cli_call(arg_socket, "metrics", "io.slotbroker.Metrics", NULL, &reply);
        if (r != 0)
                return r;
        if (arg_json)
                cli_print_json(reply, stdout);
        else {
                const char *text = string_member(reply, "text") ?: "";
                fputs(text, stdout);
                if (*text && text[strlen(text) - 1] != '\n')
                        putchar('\n');
        }
        return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* ---- history ---- */

static const char *const decisions[] = {
        "granted", "busy",    "full",     "timeout", "shed",     "unavailable",
        "cancelled", "released", "revoked", "overdue", "restored", "denied", "drained", "undrained",
        "quarantined", "unquarantined",
};

static json_t *arg_history_filters = NULL;
static unsigned arg_history_limit = 0;

static json_t *filters_free(void) {
        json_decref(arg_history_filters);
        return NULL;
}

enum { ARG_SINCE = 0x200, ARG_UNTIL, ARG_LANE, ARG_POOL, ARG_DECISION, ARG_LIMIT };

static int history_option(int c, const char *value) {
        int64_t t;
        switch (c) {
        case ARG_SINCE:
        case ARG_UNTIL:
                if (cli_parse_time(c == ARG_SINCE ? "--since" : "--until", value, &t) < 0)
                        return -EINVAL;
                return json_object_set_new(arg_history_filters, c == ARG_SINCE ? "since" : "until", json_integer(t));
        case ARG_LANE:
        case ARG_POOL:
                return json_object_set_new(arg_history_filters, c == ARG_LANE ? "lane" : "pool", json_string(value));
        case ARG_DECISION:
                for (size_t i = 0; i < ELEMENTSOF(decisions); i++)
                        if (streq(decisions[i], value))
                                return json_object_set_new(arg_history_filters, "decision", json_string(value));
                return log_usage("history", "--decision: unknown decision \"%s\"", value);
        case ARG_LIMIT:
                return cli_parse_unsigned("--limit", value, 1, INT32_MAX, &arg_history_limit);
        default:
                return log_usage("history", "unknown option");
        }
}

static void history_help(const char *verb) {
        printf("slotctl history [OPTIONS…]\n\n"
               "Show the broker's recorded decisions, oldest first.\n\n"
               "     --since=TIME       Decisions at or after TIME (-1h or \"1h ago\"; 2024-05-01 13:30; @EPOCH)\n"
               "     --until=TIME       Decisions before TIME\n"
               "     --lane=LANE        Decisions for LANE\n"
               "     --pool=POOL        Decisions for POOL\n"
               "     --decision=WHAT    granted, busy, full, timeout, shed, unavailable, cancelled,\n"
               "                        released, revoked, overdue, restored, denied, drained,\n"
               "                        undrained, quarantined or unquarantined\n"
               "     --limit=N          At most N events\n"
               "     --json             Print {\"events\": […]} as the broker's History replies give them\n"
               "     --socket=PATH      Talk to the broker at PATH\n"
               "  -h --help             Show this help\n");
}

static void print_event(json_t *e) {
        char when[64] = "?", waited[CLI_DURATION_MAX], held[CLI_DURATION_MAX], job[JOB_COLUMN_MAX + 8];
        json_int_t t = int_member(e, "time", -1);
        if (t >= 0) {
                time_t sec = (time_t) (t / (json_int_t) USEC_PER_SEC);
                struct tm tm;
                if (localtime_r(&sec, &tm))
                        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
        }
        printf("%-19s %-11s %-10s %-10s %-8s %-8s %-32s %s", when, string_member(e, "decision") ?: "?",
               string_member(e, "pool") ?: "-", string_member(e, "lane") ?: "-", duration_member(waited, e, "waitedMs", "-"),
               duration_member(held, e, "heldMs", "-"), string_member(e, "lease") ?: "-",
               job_column(job, string_member(e, "job")));
        /* A drain's or quarantine's member and why, a lease's members (SPEC §3.6): the columns above have no
         * place for them. */
        const char *d = string_member(e, "decision");
        if (d && (streq(d, "drained") || streq(d, "undrained") || streq(d, "quarantined") || streq(d, "unquarantined"))) {
                if (string_member(e, "selector"))
                        printf(" %s", string_member(e, "selector"));
                if (int_member(e, "exitStatus", -1) >= 0)
                        printf(" (exit %d)", (int) int_member(e, "exitStatus", -1));
                if (string_member(e, "reason"))
                        printf(" (%s)", string_member(e, "reason"));
                /* A drain's until (history.db schema 7), as Status prints times. */
                json_int_t u = int_member(e, "until", -1);
                time_t usec = (time_t) (u / 1000000);
                struct tm utm;
                char ubuf[32];
                if (u > 0 && localtime_r(&usec, &utm) && strftime(ubuf, sizeof ubuf, "%Y-%m-%d %H:%M:%S", &utm) > 0)
                        printf(" until %s", ubuf);
        } else if (string_member(e, "member"))
                printf(" on %s", string_member(e, "member"));
        putchar('\n');
}

int verb_history(int argc, char *argv[]) {
        static const struct option extra[] = {
                { "since", required_argument, NULL, ARG_SINCE },
                { "until", required_argument, NULL, ARG_UNTIL },
                { "lane", required_argument, NULL, ARG_LANE },
                { "pool", required_argument, NULL, ARG_POOL },
                { "decision", required_argument, NULL, ARG_DECISION },
                { "limit", required_argument, NULL, ARG_LIMIT },
                {},
        };
        int r;

        arg_history_filters = json_object();
        if (!arg_history_filters) {
                log_error("Out of memory.");
                return EXIT_FAILURE;
        }
        r = parse_common("history", history_help, argc, argv, extra, history_option);
        if (r <= 0) {
                arg_history_filters = filters_free();
                return r < 0 ? EXIT_USAGE : EXIT_SUCCESS;
        }

        /* --json is written page by page, as the text is: a month of a busy CI's events held as one JSON tree
         * took gigabytes. The bytes are those of {"events": [...]} formatted whole. */
        bool header = false;
        size_t printed = 0;
        for (;;) {
                _cleanup_(json_decrefp) json_t *reply = NULL;
                if (arg_history_limit > 0)
                        json_object_set_new(arg_history_filters, "limit", json_integer(arg_history_limit - (json_int_t) printed));
                r = cli_call(arg_socket, "history", "io.slotbroker.History", arg_history_filters, &reply);
                if (r != 0)
                        break;
                json_t *events = json_object_get(reply, "events"), *e;
                size_t i;
                if (!arg_json && cli_json_make_printable(events) < 0) {
                        log_error("Out of memory.");
                        r = EXIT_FAILURE;
                        break;
                }
                json_array_foreach(events, i, e) {
                        if (arg_history_limit > 0 && printed >= arg_history_limit)
                                break;
                        if (arg_json) {
                                _cleanup_free_ char *text = NULL;
                                if (json_format(e, &text, NULL) < 0) {
                                        log_error("Out of memory.");
                                        r = EXIT_FAILURE;
                                        break;
                                }
                                fputs(header ? "," : "{\"events\":[", stdout);
                                fputs(text, stdout);
                                header = true;
                        } else {
                                if (!header) {
                                        printf("%-19s %-11s %-10s %-10s %-8s %-8s %-32s %s\n", "TIME", "DECISION", "POOL", "LANE",
                                               "WAITED", "HELD", "LEASE", "JOB");
                                        header = true;
                                }
                                print_event(e);
                        }
                        printed++;
                }
                json_t *cursor = json_object_get(reply, "cursor");
                /* A page that brings nothing cannot advance: stop rather than ask for ever. */
                if (r != 0 || !json_is_integer(cursor) || json_array_size(events) == 0 ||
                    (arg_history_limit > 0 && printed >= arg_history_limit))
                        break;
                json_object_set(arg_history_filters, "cursor", cursor);
        }
        arg_history_filters = filters_free();
        if (r != 0) {
                /* A page that failed part way: what was printed stays unterminated (no valid JSON), as it is. */
                (void) fflush(stdout);
                return r;
        }
        if (arg_json)
                fputs(header ? "]}\n" : "{\"events\":[]}\n", stdout);
        return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
