/* SPDX-License-Identifier: MIT */
/* run.c — slotctl run: start the command first, held in a process group of its own; acquire
 * a slot with the command attached (its pidfd, which names it from any PID namespace); let it go with the lease in its environment; supervise it
 * (signals, --timeout, revocation; reconnecting to queue again, or to reclaim the lease, when brokerd
 * restarts under it) and exit with its status. SPEC §3.4 and §6. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/pidfd.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli-util.h"
#include "held-command.h"
#include "strv.h"

/* A terminal's line follows the waited time; a CI log gets a line now and then, not a flood. */
#define PROGRESS_INTERVAL_TTY USEC_PER_SEC
#define PROGRESS_INTERVAL_LOG (30 * USEC_PER_SEC)
#define KILL_AFTER_DEFAULT (5 * USEC_PER_SEC)
/* As brokerd's default reclaim-grace=: a lease held only by our connection waits that long for us. */
#define RECLAIM_FOR_DEFAULT (30 * USEC_PER_SEC)
/* Reconnection attempts start soon (a restart takes a fraction of a second) and slow down to one a
 * second: a broker that stays away is not hammered, and one that is back is found within a second. */
#define RECONNECT_BACKOFF_FIRST (100 * USEC_PER_MSEC)
#define RECONNECT_BACKOFF_MAX USEC_PER_SEC
/* How long the broker has to take the exit status of a command that has exited. A broker answers in
 * milliseconds; one that does not (stopped, hung) must not keep a finished job waiting: the status is then
 * lost, and the lease released all the same when our connection closes. */
#define RELEASE_REPLY_TIMEOUT (5 * USEC_PER_SEC)

static CliRequest arg_request = CLI_REQUEST_INIT;
static usec_t arg_timeout = USEC_INFINITY;
static usec_t arg_kill_after = KILL_AFTER_DEFAULT;
static usec_t arg_reclaim_for = RECLAIM_FOR_DEFAULT;
static bool arg_if_unavailable_run = false;
static bool arg_foreground = false;
static char **arg_command = NULL;

/* The variables a granted command gets; the same names are unset when it runs without a slot, so that
 * a nested run never sees its parent's lease as its own. */
static const char *const slot_variables[] = {
        "SLOT_LEASE", "SLOT_TOKEN", "SLOT_POOL", "SLOT_INDEX", "SLOT_MEMBER", "SLOT_LANE",
};

typedef enum RunPhase {
        PHASE_WAITING,  /* the command is blocked on its pipe until the grant */
        PHASE_RUNNING,  /* it runs */
        PHASE_STOPPING, /* --timeout or a revocation: SIGTERM sent, SIGKILL at kill_at */
        PHASE_RELEASING, /* it exited: its status is on its way to the broker, until release_until */
} RunPhase;

typedef struct Run {
        RunPhase phase;
        BrokerClient *client;  /* NULL: running without a slot, or the broker went away */
        BrokerLease *lease;
        pid_t child;           /* the command's pid and process group; 0 once reaped */
        int pidfd;             /* the command's, for our poll() and for the broker; -EBADF without pidfds */
        int signal_fd;
        HeldCommand *command;  /* until the grant */
        int tty_fd;            /* --foreground: our controlling terminal, or -EBADF */
        bool terminal_given;   /* the command's group is the terminal's foreground, by us */
        sigset_t saved_mask;
        bool mask_saved;
        int exit_status;       /* >= 0 once decided */

        /* Progress while waiting. */
        bool tty;
        bool line_drawn;       /* a live line is on the terminal */
        bool wait_announced;   /* a plain "waiting" line was printed */
        bool nested_warned;    /* the wait for a pool our parent run holds was pointed out */
        bool have_position;
        char pool[128];
        BrokerPosition position;
        usec_t wait_start;
        usec_t next_progress;

        usec_t timeout_at;
        usec_t kill_at;
        usec_t release_until;
        /* CLOCK_BOOTTIME, not monotonic like the rest: the broker's renewal counts time this host spent
         * suspended too. USEC_INFINITY until the first "held" renewal: a lease without renewals (a local
         * pool, an older broker) is not fenced. */
        usec_t fence_at;
        /* The broker's word on how long a fenced command may take to stop (its revoke-grace): a --kill-after
         * longer than that would let the command outlive its slot. USEC_INFINITY: not said. */
        usec_t fence_kill_within;

        /* The broker went away: while waiting, reconnect and queue again; while the command runs, reconnect
         * and reclaim the lease (SPEC §3.4). Both for --reclaim-for. */
        char *socket_path;     /* where the broker was reached */
        bool reconnecting;     /* the connection was lost, not queued again / the lease not reclaimed yet */
        bool reclaiming;       /* r->client carries an Acquire with reclaim, not answered yet */
        bool requeueing;       /* r->client carries the Acquire again (waiting), not answered yet */
        usec_t reconnect_at;   /* the next attempt; USEC_INFINITY: none planned */
        usec_t reconnect_until; /* when this episode's attempts end (--reclaim-for) */
        usec_t reconnect_backoff;

        /* The command's own exit status (128+N: killed by signal N) when it ended by itself while holding
         * the lease, told to the broker with the release (SPEC §3.6); -1: not (not started, or stopped by
         * us: --timeout, a revocation). */
        int command_status;
} Run;

#define RUN_INIT                                                                                                   \
        ((Run) {                                                                                                   \
                .pidfd = -EBADF,                                                                                   \
                .signal_fd = -EBADF,                                                                               \
                .tty_fd = -EBADF,                                                                                  \
                .exit_status = -1,                                                                                 \
                .next_progress = USEC_INFINITY,                                                                    \
                .timeout_at = USEC_INFINITY,                                                                       \
                .kill_at = USEC_INFINITY,                                                                          \
                .release_until = USEC_INFINITY,                                                                    \
                .fence_at = USEC_INFINITY,                                                                         \
                .fence_kill_within = USEC_INFINITY,                                                                \
                .reconnect_at = USEC_INFINITY,                                                                     \
                .command_status = -1,                                                                              \
        })

static void help(void) {
        printf("slotctl run [OPTIONS…] [--] COMMAND [ARGUMENT…]\n\n"
               "Acquire a slot from brokerd, run COMMAND with it (no shell), release it.\n\n"
               "  -l --lane=LANE                Ask under LANE (default: $SLOTBROKER_LANE)\n"
               "  -n --slots=N                  Ask for N slots (default: 1)\n"
               "     --label=[!]LABEL           Members that carry LABEL (with !: that do not); repeatable\n"
               "     --member=NAME              The member NAME\n"
               "     --no-wait                  Refuse at once rather than queue\n"
               "     --max-wait=DURATION        Wait at most DURATION (shortens the lane's budget)\n"
               "     --job=NAME                 Label for status and history (default: the CI job's URL)\n"
               "     --timeout=DURATION         Stop COMMAND this long after the grant (exit 124)\n"
               "     --kill-after=DURATION      SIGKILL this long after SIGTERM (default: 5s)\n"
               "     --reclaim-for=DURATION     Broker restarted: try this long to reconnect and reclaim\n"
               "                                the lease, or queue again if still waiting (default: 30s)\n"
               "     --if-unavailable=fail|run  Broker unreachable: exit 69, or run without a slot\n"
               "     --foreground               Give COMMAND the terminal slotctl is in the foreground of\n"
               "  -q --quiet                    Print nothing while waiting\n"
               "     --conflict-exit-code=N     Exit N when refused (default: 75)\n"
               "     --socket=PATH              Talk to the broker at PATH\n"
               "  -h --help                     Show this help\n\n"
               "COMMAND gets SLOT_LEASE, SLOT_TOKEN, SLOT_POOL, SLOT_INDEX, SLOT_MEMBER and SLOT_LANE.\n"
               "Exit status: COMMAND's own (128+N if it died of signal N); 75 refused; 124 timed out or\n"
               "revoked; 130/143 interrupted while waiting; 69 no broker; 77 permission denied; 64 usage.\n"
               "See slotctl(1).\n");
}

static int parse_argv(int argc, char *argv[]) {
        enum {
                ARG_TIMEOUT = 0x100,
                ARG_KILL_AFTER,
                ARG_RECLAIM_FOR,
                ARG_IF_UNAVAILABLE,
                ARG_FOREGROUND,
        };
        static const struct option options[] = {
                { "timeout", required_argument, NULL, ARG_TIMEOUT },
                { "kill-after", required_argument, NULL, ARG_KILL_AFTER },
                { "reclaim-for", required_argument, NULL, ARG_RECLAIM_FOR },
                { "if-unavailable", required_argument, NULL, ARG_IF_UNAVAILABLE },
                { "foreground", no_argument, NULL, ARG_FOREGROUND },
                { "help", no_argument, NULL, 'h' },
                CLI_REQUEST_OPTIONS,
                {},
        };
        int c;

        /* "+": the first non-option starts the command, whose options are its own. */
        optind = 0;
        opterr = 0;
        while ((c = getopt_long(argc, argv, "+:" CLI_REQUEST_SHORT_OPTIONS "h", options, NULL)) >= 0)
                switch (c) {
                case ARG_TIMEOUT:
                        if (cli_parse_duration("--timeout", optarg, true, &arg_timeout) < 0)
                                return -EINVAL;
                        if (arg_timeout == 0)
                                return log_usage("run", "--timeout: must be longer than 0");
                        break;
                case ARG_KILL_AFTER:
                        if (cli_parse_duration("--kill-after", optarg, false, &arg_kill_after) < 0)
                                return -EINVAL;
                        break;
                case ARG_RECLAIM_FOR:
                        if (cli_parse_duration("--reclaim-for", optarg, true, &arg_reclaim_for) < 0)
                                return -EINVAL;
                        break;
                case ARG_IF_UNAVAILABLE:
                        if (streq(optarg, "fail"))
                                arg_if_unavailable_run = false;
                        else if (streq(optarg, "run"))
                                arg_if_unavailable_run = true;
                        else
                                return log_usage("run", "--if-unavailable: expected fail or run, got \"%s\"", optarg);
                        break;
                case ARG_FOREGROUND:
                        arg_foreground = true;
                        break;
                case 'h':
                        help();
                        return 0;
                default: {
                        int k = cli_request_parse_option("run", c, optarg, &arg_request);
                        if (k < 0)
                                return k;
                        if (k == 0) /* also ':' and '?' */
                                return log_usage_option("run", c, argv);
                        break;
                }
                }

        if (optind >= argc)
                return log_usage("run", "no command given");
        arg_command = argv + optind;

        if (!arg_request.lane) {
                const char *e = getenv("SLOTBROKER_LANE");
                if (!e || !*e)
                        return log_usage("run", "no lane given: use --lane=LANE or set $SLOTBROKER_LANE");
                arg_request.lane = e;
        }
        return 1;
}

/* ---- the command ---- */

static int run_spawn(Run *r) {
        int k = held_command_new(arg_command, &r->saved_mask, &r->command);
        if (k < 0)
                return log_error_errno(k, "Failed to start the command's process: %m");
        r->child = held_command_get_pid(r->command);
        r->pidfd = pidfd_open(r->child, 0);
        if (r->pidfd < 0 && errno != ENOSYS)
                return log_error_errno(errno, "Failed to watch the command's process: %m");
        /* ENOSYS (kernels before 5.3, valgrind): SIGCHLD on the signalfd tells the same. */
        return 0;
}

/* Whether execvpe() would find nothing to run: FILE names no file (with a '/'), or none in any directory of
 * $PATH (its default, /bin:/usr/bin, when unset; an empty entry is the working directory, as for glibc).
 * Asked before queueing, so that a mistyped command fails at once rather than after its wait, on a slot
 * granted for nothing. Only a sure "nowhere" counts: any other answer (EACCES, a name too long) is for the
 * exec after the grant to report, as before. */
static bool command_is_missing(const char *file) {
        if (strchr(file, '/'))
                return access(file, F_OK) < 0 && (errno == ENOENT || errno == ENOTDIR);
        if (!*file)
                return true;

        const char *path = getenv("PATH") ?: "/bin:/usr/bin";
        for (const char *p = path;; p++) {
                const char *end = strchrnul(p, ':');
                char candidate[PATH_MAX];
                int n = end == p ? snprintf(candidate, sizeof candidate, "%s", file)
                                 : snprintf(candidate, sizeof candidate, "%.*s/%s", (int) (end - p), p, file);
                if (n < 0 || (size_t) n >= sizeof candidate)
                        return false;
                if (access(candidate, F_OK) >= 0 || (errno != ENOENT && errno != ENOTDIR))
                        return false;
                if (!*end)
                        return true;
                p = end;
        }
}

/* Signals the command's whole group. Never with pid 0: kill(0, …) would hit slotctl's own group. */
static void group_kill(const Run *r, int sig) {
        if (r->child > 0)
                (void) kill(-r->child, sig);
}

static int exit_status_of(int status) {
        if (WIFEXITED(status))
                return WEXITSTATUS(status);
        if (WIFSIGNALED(status))
                return 128 + WTERMSIG(status);
        return EXIT_FAILURE;
}

/* ---- the terminal (--foreground) ---- */

/* Makes pgid the terminal's foreground. Called from the background (taking the terminal back), tcsetpgrp()
 * would stop us with SIGTTOU: blocked meanwhile, as shells do. */
static int terminal_set_foreground(int fd, pid_t pgid) {
        sigset_t ttou, saved;
        sigemptyset(&ttou);
        sigaddset(&ttou, SIGTTOU);
        (void) sigprocmask(SIG_BLOCK, &ttou, &saved);
        int k = tcsetpgrp(fd, pgid) < 0 ? -errno : 0;
        (void) sigprocmask(SIG_SETMASK, &saved, NULL);
        return k;
}

/* The terminal to the command's group, if it is ours to give: slotctl is its foreground (not started with
 * "&", not stopped and sent on with bg). */
static void run_terminal_give(Run *r) {
        if (r->tty_fd < 0 || r->child <= 0 || r->terminal_given || tcgetpgrp(r->tty_fd) != getpgrp())
                return;
        r->terminal_given = terminal_set_foreground(r->tty_fd, r->child) >= 0;
}

/* Back to our group while the command's still exists (a shell may have given it to another job since). */
static void run_terminal_take_back(Run *r) {
        if (!r->terminal_given)
                return;
        r->terminal_given = false;
        if (r->child > 0 && tcgetpgrp(r->tty_fd) == r->child)
                (void) terminal_set_foreground(r->tty_fd, getpgrp());
}

/* Kills what is left of the command's group and reaps the leader. The group is signalled before the
 * leader is reaped: while the leader is unreaped its pid, and so the group id, cannot be reused. */
static int run_reap(Run *r, bool kill_leader) {
        int status = 0;
        if (r->child <= 0)
                return -ESRCH;
        run_terminal_take_back(r);
        if (kill_leader)
                (void) kill(r->child, SIGKILL);
        (void) kill(-r->child, SIGKILL);
        while (waitpid(r->child, &status, 0) < 0)
                if (errno != EINTR)
                        return -errno;
        r->child = 0;
        r->pidfd = safe_close(r->pidfd);
        return exit_status_of(status);
}

/* SLOT_INDEX's or SLOT_MEMBER's value: one entry per slot, comma-separated. */
static char *lease_slot_list(const BrokerLease *l, bool members) {
        char *list = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&list, &size);
        if (!f)
                return NULL;
        for (size_t i = 0; i < broker_lease_n_slots(l); i++) {
                if (i > 0)
                        fputc(',', f);
                if (members)
                        fputs(broker_lease_member(l, i) ?: "", f);
                else
                        fprintf(f, "%d", broker_lease_slot(l, i));
        }
        if (fclose(f) != 0)
                return mfree(list);
        return list;
}

/* An also= pool's variables (SPEC §3.5): SLOT_<POOL>_TOKEN, _INDEX, _MEMBER, the pool's name upper-cased and
 * anything but letters and digits as '_'. */
static bool is_also_variable(const char *assignment) {
        static const char *const suffixes[] = { "_TOKEN=", "_INDEX=", "_MEMBER=" };
        const char *eq = strchr(assignment, '=');
        if (!eq || strncmp(assignment, "SLOT_", strlen("SLOT_")) != 0)
                return false;
        size_t n = (size_t) (eq - assignment) + 1;
        for (size_t i = 0; i < ELEMENTSOF(suffixes); i++) {
                size_t k = strlen(suffixes[i]);
                if (n > strlen("SLOT_") + k && strncmp(eq + 1 - k, suffixes[i], k) == 0)
                        return true;
        }
        return false;
}

static bool is_slot_variable(const char *assignment) {
        for (size_t i = 0; i < ELEMENTSOF(slot_variables); i++) {
                size_t len = strlen(slot_variables[i]);
                if (strncmp(assignment, slot_variables[i], len) == 0 && assignment[len] == '=')
                        return true;
        }
        /* A parent's also= pools are not a nested run's either. */
        return is_also_variable(assignment);
}

/* "SLOT_" + the pool's name upper-cased, other characters '_', + suffix. */
static int also_variable(const char *pool, const char *suffix, const char *value, char **ret) {
        _cleanup_free_ char *name = NULL;
        if (asprintf(&name, "SLOT_%s_%s", pool, suffix) < 0)
                return -ENOMEM;
        for (char *c = name + strlen("SLOT_"); *c; c++)
                if (*c >= 'a' && *c <= 'z')
                        *c = (char) (*c - 'a' + 'A');
                else if (!((*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9')))
                        *c = '_';
        if (asprintf(ret, "%s=%s", name, value) < 0)
                return -ENOMEM;
        return 0;
}

/* The command's environment: ours without any SLOT_* variable, plus the lease's when it has one. */
static char **run_environment(const BrokerLease *l) {
        size_t k = 0;
        size_t n_also = broker_lease_n_also(l);
        _cleanup_(strv_freep) char **env = calloc(strv_length(environ) + ELEMENTSOF(slot_variables) + 3 * n_also + 1,
                                                  sizeof(char *));
        if (!env)
                return NULL;

        for (char **e = environ; *e; e++)
                if (!is_slot_variable(*e) && !(env[k++] = strdup(*e)))
                        return NULL;
        if (!l)
                return TAKE_PTR(env);

        _cleanup_free_ char *indices = lease_slot_list(l, false);
        _cleanup_free_ char *members = broker_lease_member(l, 0) ? lease_slot_list(l, true) : NULL;
        if (!indices || (broker_lease_member(l, 0) && !members))
                return NULL;
        char token[sizeof "18446744073709551615"];
        (void) snprintf(token, sizeof token, "%" PRIu64, broker_lease_token(l));
        const char *values[][2] = {
                { "SLOT_LEASE", broker_lease_id(l) }, { "SLOT_TOKEN", token },
                { "SLOT_POOL", broker_lease_pool(l) }, { "SLOT_LANE", broker_lease_lane(l) },
                { "SLOT_INDEX", indices }, { "SLOT_MEMBER", members }, /* without members, no SLOT_MEMBER */
        };
        for (size_t i = 0; i < ELEMENTSOF(values); i++) {
                if (!values[i][1])
                        continue;
                if (asprintf(&env[k], "%s=%s", values[i][0], values[i][1]) < 0) {
                        env[k] = NULL; /* asprintf() left it undefined */
                        return NULL;
                }
                k++;
        }
        /* Each also= pool's share (SPEC §3.5). */
        for (size_t i = 0; i < n_also; i++) {
                const BrokerLease *a = broker_lease_also(l, i);
                _cleanup_free_ char *a_indices = lease_slot_list(a, false);
                _cleanup_free_ char *a_members = broker_lease_member(a, 0) ? lease_slot_list(a, true) : NULL;
                if (!a_indices || (broker_lease_member(a, 0) && !a_members))
                        return NULL;
                (void) snprintf(token, sizeof token, "%" PRIu64, broker_lease_token(a));
                if (also_variable(broker_lease_pool(a), "TOKEN", token, &env[k]) < 0)
                        return NULL;
                k++;
                if (also_variable(broker_lease_pool(a), "INDEX", a_indices, &env[k]) < 0)
                        return NULL;
                k++;
                if (a_members) {
                        if (also_variable(broker_lease_pool(a), "MEMBER", a_members, &env[k]) < 0)
                                return NULL;
                        k++;
                }
        }
        return TAKE_PTR(env);
}

/* Lets the held command run: with the lease's variables, or (lease NULL) without a slot. */
static int run_let_go(Run *r, const BrokerLease *l) {
        _cleanup_(strv_freep) char **env = run_environment(l);
        if (!env)
                return -ENOMEM;
        int k = held_command_start(r->command, env);
        r->command = held_command_free(r->command);
        if (k == -EPIPE)
                return 0; /* already gone, which its pidfd reports */
        if (k < 0)
                /* It exits 127 or 126, which becomes our status when it is reaped. */
                log_error_errno(k, "failed to execute %s: %m", arg_command[0]);
        return 0;
}

/* ---- progress while waiting ---- */

static void progress_clear(Run *r) {
        if (r->line_drawn) {
                fputs("\r\033[K", stderr);
                fflush(stderr);
                r->line_drawn = false;
        }
}

static void progress_draw(Run *r, usec_t now) {
        char line[512], position[CLI_POSITION_MAX], waited[CLI_DURATION_MAX];
        struct winsize ws = {};

        snprintf(line, sizeof line, "slotctl: waiting for pool %s: %s, waited %s", r->pool,
                 cli_format_position(position, &r->position),
                 cli_format_duration_ms(waited, usec_sub_unsigned(now, r->wait_start) / USEC_PER_MSEC));
        /* A line wider than the terminal wraps, and "\r" then redraws only its last part. */
        if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) >= 0 && ws.ws_col > 1 && (size_t) ws.ws_col - 1 < sizeof line)
                line[ws.ws_col - 1] = '\0';
        fprintf(stderr, "\r\033[K%s", line);
        fflush(stderr);
        r->line_drawn = true;
}

/* Queued for the pool a parent slotctl run holds a slot of (its SLOT_POOL is in our environment: a job's
 * script that calls slotctl run again): when that pool has no other slot for us, we wait for our own
 * parent, until the budget runs out. Said once, since it looks like any other wait. */
static void check_nested_wait(Run *r, const BrokerPosition *p) {
        const char *parent_pool = getenv("SLOT_POOL");
        char pool[CLI_PRINTABLE_SIZE(128)], lease[CLI_PRINTABLE_SIZE(64)];

        if (r->nested_warned || !p->pool || !parent_pool || !streq(p->pool, parent_pool))
                return;
        r->nested_warned = true;
        progress_clear(r);
        log_warning("this job already holds a slot of pool %s (lease %s): a nested run that waits for one may wait "
                    "for its own parent's",
                    cli_printable(pool, sizeof pool, p->pool),
                    cli_printable(lease, sizeof lease, getenv("SLOT_LEASE") ?: "?"));
}

static void progress_update(Run *r, const BrokerPosition *p, usec_t now) {
        cli_printable(r->pool, sizeof r->pool, p->pool ?: "?");
        r->position = *p;
        r->position.pool = r->pool;
        r->have_position = true;
        if (arg_request.quiet)
                return;
        if (r->tty) {
                progress_draw(r, now);
                r->next_progress = now + PROGRESS_INTERVAL_TTY;
        } else if (!r->wait_announced) {
                char position[CLI_POSITION_MAX];
                log_notice("waiting for a slot of pool %s: %s", r->pool, cli_format_position(position, &r->position));
                r->wait_announced = true;
                r->next_progress = now + PROGRESS_INTERVAL_LOG;
        }
}

static void progress_tick(Run *r, usec_t now) {
        if (arg_request.quiet || !r->have_position) {
                r->next_progress = USEC_INFINITY;
                return;
        }
        if (r->tty) {
                progress_draw(r, now);
                r->next_progress = now + PROGRESS_INTERVAL_TTY;
        } else {
                char position[CLI_POSITION_MAX], waited[CLI_DURATION_MAX];
                log_notice("still waiting for pool %s: %s, waited %s", r->pool, cli_format_position(position, &r->position),
                           cli_format_duration_ms(waited, usec_sub_unsigned(now, r->wait_start) / USEC_PER_MSEC));
                r->next_progress = now + PROGRESS_INTERVAL_LOG;
        }
}

/* ---- phases ---- */

static void run_start(Run *r, BrokerLease *l, usec_t now) {
        progress_clear(r);
        if (r->wait_announced && l) {
                char waited[CLI_DURATION_MAX], pool[CLI_PRINTABLE_SIZE(256)];
                log_notice("granted a slot of pool %s after %s", cli_printable(pool, sizeof pool, broker_lease_pool(l) ?: "?"),
                           cli_format_duration_ms(waited, usec_sub_unsigned(now, r->wait_start) / USEC_PER_MSEC));
        }
        r->lease = l;
        run_terminal_give(r); /* before it runs: a read of the terminal in its background would stop it */
        if (run_let_go(r, l) < 0) {
                log_error("Out of memory.");
                (void) run_reap(r, true);
                r->exit_status = EXIT_FAILURE;
                return;
        }
        r->phase = PHASE_RUNNING;
        r->next_progress = USEC_INFINITY;
        if (arg_timeout != USEC_INFINITY)
                r->timeout_at = usec_add(now, arg_timeout);
}

static void run_stop(Run *r, usec_t now, const char *why) {
        if (r->phase != PHASE_RUNNING)
                return;
        log_error("%s; stopping the command", why);
        group_kill(r, SIGTERM);
        group_kill(r, SIGCONT); /* a stopped command could not act on SIGTERM */
        r->phase = PHASE_STOPPING;
        r->timeout_at = USEC_INFINITY;
        r->kill_at = usec_add(now, arg_kill_after);
}

/* The lease released with the command's exit status, so that a pool can quarantine a broken member (SPEC
 * §3.6), and without blocking: the answer comes through run_on_broker(), or run_release_end() gives up on it
 * (RELEASE_REPLY_TIMEOUT, a signal). Closing the connection releases the lease anyway: a failure only loses
 * the status. Returns whether the release is on its way. */
static bool run_release_start(Run *r, usec_t now) {
        if (!r->client || !r->lease || r->reclaiming || r->command_status < 0 || r->command_status > 255)
                return false;
        int k = broker_release_exit_start(r->client, r->command_status);
        if (k == -ESRCH)
                return false; /* the lease ended already: nothing to tell */
        if (k < 0) {
                errno = -k;
                log_warning("could not tell the broker the command's exit status: %m");
                return false;
        }
        r->phase = PHASE_RELEASING;
        r->timeout_at = USEC_INFINITY;
        r->release_until = usec_add(now, RELEASE_REPLY_TIMEOUT);
        return true;
}

/* The release is over, answered or not (why: NULL, or why the status may not have reached the broker). */
static void run_release_end(Run *r, const char *why) {
        if (why)
                log_warning("could not tell the broker the command's exit status: %s", why);
        r->exit_status = r->command_status;
}

/* After a NONE while releasing: the Release refused. An older broker refuses the status (InvalidParameter),
 * and would not have used it either; the lease goes when our connection closes. */
static void run_release_check_refused(Run *r) {
        static const char invalid_parameter[] = ".InvalidParameter"; /* io.slotbroker.'s or org.varlink.service.'s */
        const char *name = broker_client_error_name(r->client);
        char printable[CLI_PRINTABLE_SIZE(128)];

        if (!name)
                return;
        size_t n = strlen(name);
        if (n >= strlen(invalid_parameter) && streq(name + n - strlen(invalid_parameter), invalid_parameter))
                run_release_end(r, NULL);
        else
                run_release_end(r, cli_printable(printable, sizeof printable, name));
}

/* Before the grant: nothing ran; the child is killed unseen and the request withdrawn. */
static void run_abandon(Run *r, int exit_status) {
        progress_clear(r);
        /* Closing the connection withdraws the request, or ends a grant still on its way to us. */
        r->client = broker_client_free(r->client);
        (void) run_reap(r, true);
        r->exit_status = exit_status;
}

static void run_on_signal(Run *r, int sig) {
        if (r->phase == PHASE_WAITING) {
                run_abandon(r, 128 + sig);
                return;
        }
        if (r->phase == PHASE_RELEASING) {
                /* The command is done: a signal means "do not wait for the broker". */
                run_release_end(r, "interrupted by a signal");
                return;
        }
        /* The command decides what a signal means; its status becomes ours. SIGCONT after it, as timeout(1)
         * does: a stopped command (SIGTTIN, reading from the terminal it is in the background of) acts on no
         * signal until continued, and slotctl would wait for it, holding the slot, however often signalled. */
        group_kill(r, sig);
        group_kill(r, SIGCONT);
}

/* ---- the broker restarted under the command ---- */

static void run_reconnect_end(Run *r) {
        r->reconnecting = r->reclaiming = r->requeueing = false;
        r->reconnect_at = USEC_INFINITY;
}

/* When --max-wait runs out, counted from our first Acquire: a wait queued again is not a new wait. */
static usec_t run_max_wait_deadline(const Run *r) {
        if (arg_request.max_wait == USEC_INFINITY)
                return USEC_INFINITY;
        return usec_add(r->wait_start, arg_request.max_wait);
}

static void run_requeue_give_up(Run *r, usec_t now) {
        char t[TIMESPAN_MAX];
        run_reconnect_end(r);
        if (now >= run_max_wait_deadline(r)) {
                log_error("waited --max-wait=%s without a slot (the broker was away)",
                          timespan_format(t, sizeof t, arg_request.max_wait));
                run_abandon(r, (int) arg_request.conflict_exit_code);
                return;
        }
        if (arg_if_unavailable_run) {
                log_warning("could not queue again within --reclaim-for=%s; running the command without a slot",
                            timespan_format(t, sizeof t, arg_reclaim_for));
                run_start(r, NULL, now);
                return;
        }
        log_error("could not reach the broker again within --reclaim-for=%s to queue again",
                  timespan_format(t, sizeof t, arg_reclaim_for));
        run_abandon(r, EXIT_UNREACHABLE);
}

static void run_reconnect_schedule(Run *r, usec_t now) {
        if (r->phase == PHASE_WAITING) {
                usec_t until = MIN(r->reconnect_until, run_max_wait_deadline(r));
                if (now >= until) {
                        run_requeue_give_up(r, now);
                        return;
                }
                r->reconnect_at = MIN(usec_add(now, r->reconnect_backoff), until);
                r->reconnect_backoff = MIN(r->reconnect_backoff * 2, RECONNECT_BACKOFF_MAX);
                return;
        }
        if (now >= r->reconnect_until) {
                char t[TIMESPAN_MAX];
                log_warning("could not reclaim lease %s within %s; the command keeps running without the broker's "
                            "word (brokerd keeps its slots while it runs)",
                            broker_lease_id(r->lease), timespan_format(t, sizeof t, arg_reclaim_for));
                run_reconnect_end(r);
                return;
        }
        r->reconnect_at = MIN(usec_add(now, r->reconnect_backoff), r->reconnect_until);
        r->reconnect_backoff = MIN(r->reconnect_backoff * 2, RECONNECT_BACKOFF_MAX);
}

/* Names the command in an Acquire: by its pidfd, which means the same process to a broker in another PID
 * namespace (slotctl in a CI job's container); by its pid where there are no pidfds (kernels before 5.3,
 * valgrind), which is right only when the broker shares our PID namespace. */
static void run_attach_command(const Run *r, BrokerAcquireOptions *o) {
        if (r->pidfd >= 0)
                o->pidfd = r->pidfd;
        else
                o->pid = r->child;
}

/* The Acquire of this run: the same lane, options, job label and command each time it is sent; a --max-wait
 * is sent as what is left of it. Returns 0, or -ETIME when nothing is left. */
static int run_acquire_options(const Run *r, usec_t now, BrokerAcquireOptions *ret) {
        BrokerAcquireOptions o = BROKER_ACQUIRE_OPTIONS_INIT;
        o.lane = arg_request.lane;
        o.slots = arg_request.slots;
        o.wait = arg_request.no_wait ? BROKER_WAIT_NO : BROKER_WAIT_DEFAULT;
        if (arg_request.max_wait != USEC_INFINITY) {
                usec_t left = usec_sub_unsigned(run_max_wait_deadline(r), now);
                if (left == 0)
                        return -ETIME;
                o.queue_wait_ms = DIV_ROUND_UP(left, USEC_PER_MSEC);
        }
        o.job = arg_request.job;
        o.labels = arg_request.n_labels > 0 ? arg_request.labels : NULL;
        o.member = arg_request.member;
        o.fence = true; /* renewals come only for leases that need them: a shared pool's */
        run_attach_command(r, &o);
        *ret = o;
        return 0;
}

/* One attempt to queue again after a loss while waiting. A broker not listening yet (ENOENT while the
 * socket is being created again, ECONNREFUSED) means another attempt later; any other failure ends the
 * run as it would have at the first connect. */
static void run_requeue(Run *r, usec_t now) {
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;
        BrokerAcquireOptions o;
        int k;

        r->reconnect_at = USEC_INFINITY;
        if (run_acquire_options(r, now, &o) < 0) {
                run_requeue_give_up(r, now);
                return;
        }
        k = broker_client_connect(r->socket_path, &c);
        if (k < 0 && !cli_errno_is_unreachable(k)) {
                log_error_errno(k, "cannot reconnect to the broker at %s: %m", r->socket_path);
                run_abandon(r, cli_exit_status_from_errno(k));
                return;
        }
        if (k >= 0 && broker_acquire_start(c, &o) >= 0) {
                r->client = TAKE_PTR(c);
                r->requeueing = true;
                return;
        }
        run_reconnect_schedule(r, now);
}

static void run_requeued(Run *r, const BrokerPosition *p, usec_t now) {
        char position[CLI_POSITION_MAX], pool[CLI_PRINTABLE_SIZE(256)];
        run_reconnect_end(r);
        progress_clear(r);
        log_notice("reconnected to the broker; queued again for pool %s: %s",
                   cli_printable(pool, sizeof pool, p->pool ?: "?"), cli_format_position(position, p));
        progress_update(r, p, now);
        if (!r->tty && !arg_request.quiet)
                r->next_progress = now + PROGRESS_INTERVAL_LOG;
}

/* One attempt: connect, and ask for the lease back with the command attached. The answer comes through
 * run_on_broker(); a broker that is not listening yet means another attempt later. */
static void run_reconnect(Run *r, usec_t now) {
        _cleanup_(broker_client_freep) BrokerClient *c = NULL;

        if (r->phase == PHASE_WAITING) {
                run_requeue(r, now);
                return;
        }
        r->reconnect_at = USEC_INFINITY;
        if (broker_client_connect(r->socket_path, &c) >= 0) {
                BrokerAcquireOptions o = BROKER_ACQUIRE_OPTIONS_INIT;
                o.lane = broker_lease_lane(r->lease);
                o.reclaim = broker_lease_id(r->lease);
                o.fence = true;
                run_attach_command(r, &o);
                if (broker_acquire_start(c, &o) >= 0) {
                        r->client = TAKE_PTR(c);
                        r->reclaiming = true;
                        return;
                }
        }
        run_reconnect_schedule(r, now);
}

static void run_reclaimed(Run *r, BrokerLease *l) {
        run_reconnect_end(r);
        log_notice("reconnected to the broker; lease %s reclaimed", broker_lease_id(l));
        broker_lease_free(r->lease);
        r->lease = l;
}

/* The broker answered the reclaim with no: the command keeps running; a lease the broker restored for
 * the command's pid stays held while it runs, and that is all that can be had. */
static void run_reclaim_refused(Run *r, int result) {
        run_reconnect_end(r);
        r->client = broker_client_free(r->client);
        if (result == BROKER_NO_SUCH_LEASE)
                log_warning("the broker no longer knows lease %s; the command keeps running",
                            broker_lease_id(r->lease));
        else
                log_warning("the broker refused to give lease %s back (%s); the command keeps running",
                            broker_lease_id(r->lease), broker_result_to_string(result) ?: "error");
}

static void run_on_broker_lost(Run *r, int error, usec_t now) {
        r->client = broker_client_free(r->client);
        if (r->phase == PHASE_RELEASING) {
                run_release_end(r, strerror(-error));
                return;
        }
        if (r->phase != PHASE_WAITING) {
                r->reclaiming = false;
                if (r->phase != PHASE_RUNNING || !r->lease || !r->socket_path || arg_reclaim_for == 0) {
                        errno = -error;
                        log_warning("lost the connection to the broker (%m); the command keeps running");
                        run_reconnect_end(r);
                        return;
                }
                if (!r->reconnecting) {
                        /* A lost reclaim attempt (the broker not ready yet, or gone again) is part of the episode. */
                        errno = -error;
                        log_warning("lost the connection to the broker (%m); the command keeps running, reconnecting "
                                    "to reclaim lease %s", broker_lease_id(r->lease));
                        r->reconnecting = true;
                        r->reconnect_until = usec_add(now, arg_reclaim_for);
                        r->reconnect_backoff = RECONNECT_BACKOFF_FIRST;
                }
                run_reconnect_schedule(r, now);
                return;
        }
        progress_clear(r);
        if (cli_errno_is_unreachable(error) && r->socket_path && arg_reclaim_for > 0) {
                /* A restart without a store of our connection: queue again, which puts us behind those that
                 * queued meanwhile (SPEC §3.4). A broker answering garbage (-EBADMSG) is not retried. */
                r->requeueing = false;
                if (!r->reconnecting) {
                        char t[TIMESPAN_MAX];
                        errno = -error;
                        log_warning("lost the connection to the broker while waiting (%m); reconnecting to queue "
                                    "again for up to %s", timespan_format(t, sizeof t, arg_reclaim_for));
                        r->reconnecting = true;
                        r->reconnect_until = usec_add(now, arg_reclaim_for);
                        r->reconnect_backoff = RECONNECT_BACKOFF_FIRST;
                        r->have_position = false; /* no stale position line while away */
                        r->next_progress = USEC_INFINITY;
                }
                run_reconnect_schedule(r, now);
                return;
        }
        if (arg_if_unavailable_run && cli_errno_is_unreachable(error)) {
                log_warning("lost the connection to the broker while waiting; running the command without a slot");
                run_start(r, NULL, now);
                return;
        }
        log_error_errno(error, "lost the connection to the broker while waiting: %m");
        run_abandon(r, cli_errno_is_unreachable(error) ? EXIT_UNREACHABLE : EXIT_FAILURE);
}

static void run_on_broker(Run *r, usec_t now) {
        while (r->client && r->exit_status < 0) {
                BrokerEvent ev = BROKER_EVENT_INIT;
                int k = broker_client_process(r->client, &ev);
                if (k < 0) {
                        run_on_broker_lost(r, k, now);
                        return;
                }
                if (r->phase == PHASE_RELEASING) {
                        /* The lease's end (RELEASED, or REVOKED while a straggler of the command's group is
                         * still being killed) is the answer; a NONE may follow a refusal of the Release. */
                        if (ev.type == BROKER_EVENT_NONE) {
                                run_release_check_refused(r);
                                return;
                        }
                        if (ev.type == BROKER_EVENT_RELEASED || ev.type == BROKER_EVENT_REVOKED)
                                run_release_end(r, NULL);
                        continue;
                }
                switch (ev.type) {
                case BROKER_EVENT_NONE:
                        return;
                case BROKER_EVENT_QUEUED:
                        if (r->phase == PHASE_WAITING)
                                check_nested_wait(r, &ev.position);
                        if (r->phase == PHASE_WAITING && r->requeueing)
                                run_requeued(r, &ev.position, now);
                        else if (r->phase == PHASE_WAITING)
                                progress_update(r, &ev.position, now);
                        break;
                case BROKER_EVENT_GRANTED:
                        if (r->reclaiming)
                                run_reclaimed(r, ev.lease);
                        else {
                                if (r->requeueing) {
                                        run_reconnect_end(r);
                                        log_notice("reconnected to the broker; granted at once");
                                }
                                run_start(r, ev.lease, now);
                        }
                        break;
                case BROKER_EVENT_REFUSED:
                        if (r->reclaiming) {
                                run_reclaim_refused(r, ev.refusal);
                                return;
                        }
                        run_reconnect_end(r); /* a refusal after queueing again ends the run as any refusal */
                        progress_clear(r);
                        run_abandon(r, cli_log_result(r->client, "acquire", ev.refusal, (int) arg_request.conflict_exit_code));
                        return;
                case BROKER_EVENT_RELEASED:
                        /* The broker sends this only when no command holds the lease any more. */
                        log_warning("the lease was released from another connection");
                        break;
                case BROKER_EVENT_REVOKED:
                        run_stop(r, now, "the lease was revoked (max-hold or an administrator)");
                        break;
                case BROKER_EVENT_HELD:
                        /* From the receipt: the broker's own deadline is later by the time the reply travelled. */
                        r->fence_at = usec_add(now_boottime(), ev.fence_in_ms * USEC_PER_MSEC);
                        r->fence_kill_within = ev.kill_within_ms == UINT64_MAX ? USEC_INFINITY
                                                                                : ev.kill_within_ms * USEC_PER_MSEC;
                        break;
                default:
                        break;
                }
        }
}

static void run_on_child_exit(Run *r, usec_t now);

/* --foreground: we were continued (fg, bg, or after our own stop). The command gets the terminal if we are
 * its foreground, and goes on either way. */
static void run_on_continue(Run *r) {
        if (r->phase != PHASE_RUNNING && r->phase != PHASE_STOPPING)
                return;
        run_terminal_give(r);
        group_kill(r, SIGCONT);
}

/* Takes a SIGCONT pending (blocked under --foreground: the signalfd reports it too). */
static bool sigcont_take(void) {
        sigset_t cont;
        sigemptyset(&cont);
        sigaddset(&cont, SIGCONT);
        return sigtimedwait(&cont, NULL, &(struct timespec) {}) == SIGCONT;
}

/* The command stopped: it holds its slot and runs no more until it is continued or ended. With --foreground
 * its stop is the job's, and the shell waits for slotctl, not for it: slotctl stops too (Ctrl-Z, or a read of
 * the terminal in its background), the terminal back to its group, and once continued (fg, bg) gives it on.
 * Otherwise, or when our stop was discarded (our group orphaned: nobody would continue us), slotctl says why
 * a read or a setting of the terminal stopped the command rather than wait in silence (slotctl(1), NOTES). */
static void run_on_child_stop(Run *r) {
        siginfo_t si = {};
        if (waitid(P_PID, (id_t) r->child, &si, WSTOPPED | WNOHANG) < 0 || si.si_pid == 0 || si.si_code != CLD_STOPPED)
                return;
        bool by_terminal = si.si_status == SIGTTIN || si.si_status == SIGTTOU;
        if (r->tty_fd >= 0 && (r->phase == PHASE_RUNNING || r->phase == PHASE_STOPPING)) {
                run_terminal_take_back(r);
                (void) sigcont_take();
                /* Not SIGSTOP, which no orphaned group discards. */
                (void) raise(by_terminal ? si.si_status : SIGTSTP);
                /* Discarded: a Ctrl-Z goes on at once, as the kernel discards one sent to an orphaned group;
                 * any other stop (SIGSTOP by hand) stays, as without --foreground. */
                if (sigcont_take() || si.si_status == SIGTSTP) {
                        run_on_continue(r);
                        return;
                }
        }
        if (by_terminal)
                log_warning("the command is stopped by %s: it used the terminal, in whose background it runs (give "
                            "it </dev/null, or run slotctl with --foreground in the terminal's foreground); it holds "
                            "its slot until continued or ended (Ctrl-C)",
                            si.si_status == SIGTTIN ? "SIGTTIN" : "SIGTTOU");
}

static void run_on_signals(Run *r, usec_t now) {
        struct signalfd_siginfo si;
        while (r->exit_status < 0) {
                ssize_t n = read(r->signal_fd, &si, sizeof si);
                if (n != sizeof si)
                        return; /* EAGAIN: all read */
                if (si.ssi_signo == SIGCHLD) {
                        if (r->child > 0)
                                run_on_child_exit(r, now); /* checks, without reaping, whether it was ours */
                        if (r->child > 0)
                                run_on_child_stop(r);
                } else if (si.ssi_signo == SIGCONT)
                        run_on_continue(r);
                else
                        run_on_signal(r, (int) si.ssi_signo);
        }
}

static void run_on_child_exit(Run *r, usec_t now) {
        siginfo_t si = {};
        /* WNOWAIT: the leader stays a zombie, and its group id reserved, until run_reap() killed the rest. */
        if (waitid(P_PID, (id_t) r->child, &si, WEXITED | WNOHANG | WNOWAIT) < 0 || si.si_pid == 0)
                return;
        int status = run_reap(r, false);
        if (r->phase == PHASE_WAITING) {
                progress_clear(r);
                r->client = broker_client_free(r->client);
                log_error("the command's process ended before it was started");
                r->exit_status = status >= 0 ? status : EXIT_FAILURE;
                return;
        }
        if (r->phase != PHASE_STOPPING && status >= 0) {
                r->command_status = status;
                if (run_release_start(r, now))
                        return;
        }
        r->exit_status = r->phase == PHASE_STOPPING ? EXIT_TIMEOUT : status >= 0 ? status : EXIT_FAILURE;
}

static int run_loop(Run *r) {
        while (r->exit_status < 0) {
                struct pollfd p[3] = {
                        { .fd = r->signal_fd, .events = POLLIN },
                        { .fd = r->pidfd, .events = POLLIN },
                        { .fd = -1 },
                };
                if (r->client)
                        p[2] = (struct pollfd) { .fd = broker_client_get_fd(r->client),
                                                 .events = (short) broker_client_get_events(r->client) };

                usec_t now = now_monotonic();
                usec_t deadline = MIN(MIN(r->next_progress, r->reconnect_at), MIN(r->timeout_at, r->kill_at));
                deadline = MIN(deadline, r->release_until);
                if (r->phase == PHASE_RUNNING && r->fence_at != USEC_INFINITY)
                        /* The fence in the monotonic terms of the rest: what is left of it now. */
                        deadline = MIN(deadline, usec_add(now, usec_sub_unsigned(r->fence_at, now_boottime())));
                int timeout = -1;
                if (deadline != USEC_INFINITY)
                        timeout = deadline <= now ? 0 : (int) MIN(DIV_ROUND_UP(deadline - now, USEC_PER_MSEC), (usec_t) INT_MAX);

                if (poll(p, ELEMENTSOF(p), timeout) < 0) {
                        if (errno == EINTR)
                                continue;
                        return log_error_errno(errno, "poll() failed: %m");
                }
                now = now_monotonic();

                if (p[0].revents)
                        run_on_signals(r, now);
                if (r->exit_status < 0 && r->client && p[2].revents)
                        run_on_broker(r, now);
                if (r->exit_status < 0 && r->child > 0 && p[1].revents)
                        run_on_child_exit(r, now);
                if (r->exit_status >= 0)
                        break;

                if (r->phase == PHASE_RELEASING && now >= r->release_until) {
                        char t[TIMESPAN_MAX];
                        char why[TIMESPAN_MAX + 32];
                        snprintf(why, sizeof why, "no answer within %s", timespan_format(t, sizeof t, RELEASE_REPLY_TIMEOUT));
                        run_release_end(r, why);
                        break;
                }

                if (now >= r->kill_at) {
                        group_kill(r, SIGKILL);
                        r->kill_at = USEC_INFINITY;
                }
                if (r->phase == PHASE_RUNNING && now_boottime() >= r->fence_at) {
                        /* The broker may be stopped or cut off, and the pool's other brokers free its slots
                         * after their timeout: the command stops before that, as for a revocation. */
                        r->fence_at = USEC_INFINITY;
                        run_stop(r, now, "no renewal of the lease came in time (the broker is stopped or cut off)");
                        if (r->phase == PHASE_STOPPING && r->fence_kill_within < arg_kill_after)
                                r->kill_at = usec_add(now, r->fence_kill_within);
                }
                if (now >= r->timeout_at) {
                        char t[TIMESPAN_MAX];
                        char why[TIMESPAN_MAX + 32];
                        snprintf(why, sizeof why, "--timeout=%s reached", timespan_format(t, sizeof t, arg_timeout));
                        run_stop(r, now, why);
                }
                if (now >= r->next_progress)
                        progress_tick(r, now);
                if (now >= r->reconnect_at && !r->client)
                        run_reconnect(r, now);
        }
        return 0;
}

static void run_done(Run *r) {
        progress_clear(r);
        if (r->child > 0)
                (void) run_reap(r, true);
        /* After the command: closing the connection is what releases the lease. */
        r->client = broker_client_free(r->client);
        r->lease = broker_lease_free(r->lease);
        safe_close(r->pidfd);
        safe_close(r->signal_fd);
        safe_close(r->tty_fd);
        r->command = held_command_free(r->command);
        free(r->socket_path);
        if (r->mask_saved) {
                /* SIGPIPE stays blocked: a write to a reader that went away (stderr's) left it pending, and it
                 * must not end slotctl on its way out, in place of the command's status. */
                sigset_t mask = r->saved_mask;
                sigaddset(&mask, SIGPIPE);
                (void) sigprocmask(SIG_SETMASK, &mask, NULL);
        }
}

int verb_run(int argc, char *argv[]) {
        _cleanup_(run_done) Run r = RUN_INIT;
        _cleanup_free_ char *job = NULL;
        sigset_t mask;
        int k;

        k = parse_argv(argc, argv);
        if (k <= 0)
                return k < 0 ? EXIT_USAGE : EXIT_SUCCESS;
        if (!arg_request.job) {
                if (cli_job_from_environment(&job) < 0) {
                        log_error("Out of memory.");
                        return EXIT_FAILURE;
                }
                arg_request.job = job;
        }
        r.tty = isatty(STDERR_FILENO) && !arg_request.quiet;

        if (command_is_missing(arg_command[0])) {
                errno = ENOENT;
                log_error("failed to execute %s: %m", arg_command[0]);
                return EXIT_NOT_FOUND;
        }

        /* An ignored SIGCHLD survives exec: a parent that ignores it would have the kernel reap the command
         * unseen, leaving us no status to wait for, and the command that disposition too. */
        if (signal(SIGCHLD, SIG_DFL) == SIG_ERR) {
                log_error_errno(errno, "Failed to reset SIGCHLD: %m");
                return EXIT_FAILURE;
        }

        /* Signals arrive through a signalfd, in the loop. SIGPIPE is blocked too (not ignored: an ignored
         * disposition would survive exec into the command); the child restores the mask before exec. */
        sigemptyset(&mask);
        sigaddset(&mask, SIGINT);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGHUP);
        sigaddset(&mask, SIGQUIT);
        sigaddset(&mask, SIGCHLD); /* the pidfd's stand-in where there is none */
        if (arg_foreground) {
                /* A stop of the command is ours to follow (shells wait for slotctl): the terminal, and whether
                 * we are its foreground when continued. No terminal (CI): nothing to give. */
                r.tty_fd = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);
                if (r.tty_fd >= 0)
                        sigaddset(&mask, SIGCONT); /* still continues us: blocked, it is only reported too */
        }
        if (sigprocmask(SIG_BLOCK, &mask, &r.saved_mask) < 0) {
                log_error_errno(errno, "Failed to block signals: %m");
                return EXIT_FAILURE;
        }
        r.mask_saved = true;
        r.signal_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
        if (r.signal_fd < 0) {
                log_error_errno(errno, "Failed to create a signalfd: %m");
                return EXIT_FAILURE;
        }
        sigset_t pipe_mask;
        sigemptyset(&pipe_mask);
        sigaddset(&pipe_mask, SIGPIPE);
        (void) sigprocmask(SIG_BLOCK, &pipe_mask, NULL);

        /* The command first, so that it goes with the Acquire call (SPEC §3.4) and so that it holds
         * no copy of the broker connection (which would keep a withdrawn request alive). */
        if (run_spawn(&r) < 0)
                return EXIT_FAILURE;
        r.wait_start = now_monotonic();

        k = cli_connect(arg_request.socket, &r.client);
        if (k < 0) {
                if (arg_if_unavailable_run && cli_errno_is_unreachable(k)) {
                        log_warning("running the command without a slot (--if-unavailable=run)");
                        run_start(&r, NULL, now_monotonic());
                } else {
                        run_abandon(&r, cli_exit_status_from_errno(k));
                        return r.exit_status;
                }
        } else {
                /* Kept for a reconnection, should the broker restart while the command runs. */
                r.socket_path = strdup(broker_client_get_socket_path(r.client));
                if (!r.socket_path) {
                        log_error("Out of memory.");
                        run_abandon(&r, EXIT_FAILURE);
                        return r.exit_status;
                }
                BrokerAcquireOptions o;
                /* At wait_start all of --max-wait (at least 1 ms) is left: -ETIME cannot come. */
                k = run_acquire_options(&r, r.wait_start, &o);
                if (k >= 0)
                        k = broker_acquire_start(r.client, &o);
                if (k == -EINVAL) {
                        log_error("invalid request (a job label or lane that is not UTF-8?)");
                        run_abandon(&r, EXIT_USAGE);
                        return r.exit_status;
                }
                if (k < 0)
                        run_on_broker_lost(&r, k, now_monotonic());
        }

        if (r.exit_status < 0 && run_loop(&r) < 0)
                return EXIT_FAILURE;
        return r.exit_status;
}
