/* SPDX-License-Identifier: MIT */
/* bench-labels — issue 22 item 9: 10,000 waiters with random label sets over 64 labelled members; how long
 * does the engine take to hand a released member on (release + the instant that grants it: p50/p99/max),
 * and how much memory does it hold? The same run without labels (every waiter takes any member) is the
 * reference: the ratio of the two is the cost of matching per member.
 *
 *   bench-labels [WAITERS [RELEASES]]        (defaults 10000 and 5000)
 *   bench-labels arrivals [ARRIVALS]         (default 1000)
 *   bench-labels config [ROUNDS]             (default 5)
 *
 * The second: arrivals at a pool of 10,000 members, one label on 5,000 of them (the review's pool: a selector
 * was resolved member by member against the label's list, per arrival). Each arrival asks for a label, its
 * negation, or a named member carrying it, is granted at once and released; acquire + grant is timed. The
 * same arrivals without labels are the reference, in the same run.
 *
 * The third: the configuration of that pool read and validated as brokerd --check-config and a reload do
 * (config_load_buffer()): members= of 10,000, a label on every other of them listed from the end, and a lane
 * whose labels= only the last member satisfies (the check that some member can satisfy it looks at every
 * member before it). The slowest and the fastest of ROUNDS are printed, and the same configuration without the
 * label and the lane's labels= is the reference, in the same run.
 *
 * The engine alone, on a fake clock: no sockets, no brokerd (bench-waiters measures those). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench-util.h"
#include "config-files.h"
#include "engine.h"
#include "macro.h"
#include "strv.h"

#define MEMBERS 64
#define LABELS 8

static uint64_t rng = 12345;
static uint64_t rnd(void) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
}

static uint64_t engine_random(void *userdata) {
        return rnd();
}

typedef struct Slot {
        EngineRequest *request;
        EngineLease *lease;
        char *terms[3];
} Slot;

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
        return x < y ? -1 : x > y;
}

/* `pool` (its names kept alive by the caller) and a lane "l" that waits for it, configured at `now`. */
static void configure(Engine *e, PoolConfig *pool, usec_t now) {
        PoolConfig *pools[] = { pool };
        LaneConfig lane = { .name = (char *) "l", .pools = (char *[]) { pool->name, NULL }, .n_pools = 1,
                            .policy = LANE_POLICY_WAIT, .max_in_use = -1, .max_hold = USEC_INFINITY };
        LaneConfig *lanes[] = { &lane };
        BrokerConfig c = { .pools = pools, .n_pools = 1, .lanes = lanes, .n_lanes = 1 };
        if (engine_configure(e, &c, now) < 0) {
                fprintf(stderr, "engine configuration failed\n");
                exit(EXIT_FAILURE);
        }
}

static Engine *engine_with(PoolConfig *pool) {
        Engine *e;
        if (engine_new(engine_random, NULL, &e) < 0) {
                fprintf(stderr, "engine set-up failed\n");
                exit(EXIT_FAILURE);
        }
        configure(e, pool, 0);
        return e;
}

/* One run: WAITERS waiting (with label sets, or none), then RELEASES times: release the oldest lease, run
 * the instant, note how long both took. Prints p50/p99/max in µs and the peak RSS growth. */
static void run(bool labelled, size_t n_waiters, size_t n_releases) {
        static const char *const names[LABELS] = { "arm64", "usb3", "gpu", "big", "fast", "eu", "us", "flash" };
        PoolConfig pool = { .name = (char *) "rigs", .limit = MEMBERS, .n_members = MEMBERS, .max_queue = -1 };
        char *members[MEMBERS + 1] = {};
        PoolLabel labels[LABELS];
        for (size_t i = 0; i < MEMBERS; i++)
                if (asprintf(&members[i], "rig-%02zu", i) < 0)
                        exit(EXIT_FAILURE);
        pool.members = members;
        /* Each label on about half the members: a set of 1–3 terms matches 1/2 to 1/8 of them. */
        for (size_t l = 0; l < LABELS; l++) {
                labels[l] = (PoolLabel) { .name = (char *) names[l], .members = calloc(MEMBERS + 1, sizeof(char *)) };
                for (size_t i = 0, k = 0; i < MEMBERS; i++)
                        if (rnd() % 2)
                                labels[l].members[k++] = members[i];
        }
        pool.labels = labels;
        pool.n_labels = LABELS;
        Engine *e = engine_with(&pool);
        size_t n = MEMBERS + n_waiters + n_releases;
        Slot *slots = calloc(n, sizeof(Slot));
        uint64_t *lat = calloc(n_releases, sizeof(uint64_t));
        struct rusage before, after;
        getrusage(RUSAGE_SELF, &before);
        usec_t now = 1;
        size_t next = 0, oldest = 0, granted = 0;

        /* Every member held, then the queue. */
        for (size_t i = 0; i < n; i++) {
                Slot *s = &slots[i];
                if (labelled && i >= MEMBERS) {
                        size_t k = 1 + rnd() % 2;
                        for (size_t t = 0; t < k; t++)
                                s->terms[t] = (char *) names[rnd() % LABELS];
                        if (k == 2 && rnd() % 4 == 0)
                                s->terms[1] = (char *[]) { "!arm64", "!usb3", "!gpu", "!big" }[rnd() % 4];
                }
                int r = engine_acquire(e,
                                       &(EngineAcquire) { .lane = "l", .slots = 1, .max_wait = USEC_INFINITY,
                                                          .userdata = s,
                                                          .labels = s->terms[0] ? (const char *const *) s->terms : NULL },
                                       now, &s->request);
                if (r == -EINVAL) { /* a contradiction, or a set no member carries: another */
                        memset(s->terms, 0, sizeof s->terms);
                        i--;
                        continue;
                }
                if (r < 0) {
                        fprintf(stderr, "acquire: %s\n", strerror(-r));
                        exit(EXIT_FAILURE);
                }
                if (i + 1 == MEMBERS + n_waiters)
                        break;
        }
        next = MEMBERS + n_waiters;
        EngineEvent ev;
        for (size_t r = 0; r <= n_releases; r++) {
                engine_run(e, now);
                while (engine_pop_event(e, &ev))
                        if (ev.type == ENGINE_EVENT_GRANTED) {
                                ((Slot *) ev.userdata)->lease = ev.lease;
                                granted++;
                        }
                if (r == n_releases)
                        break;
                /* The oldest lease goes; one more waiter joins so the queue stays as long. */
                while (!slots[oldest].lease)
                        oldest++;
                now += 1000;
                uint64_t t0 = bench_now_ns();
                engine_lease_release(slots[oldest].lease, now);
                engine_run(e, now);
                lat[r] = bench_now_ns() - t0;
                slots[oldest].lease = NULL;
                while (engine_pop_event(e, &ev))
                        if (ev.type == ENGINE_EVENT_GRANTED) {
                                ((Slot *) ev.userdata)->lease = ev.lease;
                                granted++;
                        }
                Slot *s = &slots[next++];
                if (labelled)
                        s->terms[0] = (char *) names[rnd() % LABELS];
                if (engine_acquire(e,
                                   &(EngineAcquire) { .lane = "l", .slots = 1, .max_wait = USEC_INFINITY, .userdata = s,
                                                      .labels = s->terms[0] ? (const char *const *) s->terms : NULL },
                                   now, &s->request) < 0)
                        exit(EXIT_FAILURE);
        }
        getrusage(RUSAGE_SELF, &after);
        qsort(lat, n_releases, sizeof(uint64_t), cmp_u64);
        printf("%-10s waiters %zu, releases %zu, grants %zu: release + grant p50 %.1f µs, p99 %.1f µs, max %.1f µs; "
               "max RSS %ld MiB\n",
               labelled ? "labelled" : "unlabelled", n_waiters, n_releases, granted, lat[n_releases / 2] / 1e3,
               lat[n_releases * 99 / 100] / 1e3, lat[n_releases - 1] / 1e3, after.ru_maxrss / 1024);
        for (size_t i = 0; i < n; i++)
                engine_request_unref(slots[i].request);
        engine_free(e);
        free(slots);
        free(lat);
        for (size_t l = 0; l < LABELS; l++)
                free(labels[l].members);
        for (size_t i = 0; i < MEMBERS; i++)
                free(members[i]);
}

#define BIG_MEMBERS 10000
#define RELOADS 4

/* ARRIVALS arrivals one after the other at the big pool (labelled: a selector each, or none), each granted and
 * released at once. Prints p50/p99/max and the total of acquire + grant, in µs. Then RELOADS reloads that list
 * the members in reverse order and back (their lives and the label's sets follow by name): the slowest. */
static void run_arrivals(bool labelled, size_t n_arrivals) {
        PoolConfig pool = { .name = (char *) "fleet", .limit = BIG_MEMBERS, .n_members = BIG_MEMBERS, .max_queue = -1 };
        char **members = calloc(BIG_MEMBERS + 1, sizeof(char *)), **half = calloc(BIG_MEMBERS / 2 + 1, sizeof(char *));
        if (!members || !half)
                exit(EXIT_FAILURE);
        for (size_t i = 0; i < BIG_MEMBERS; i++)
                if (asprintf(&members[i], "host-%05zu", i) < 0)
                        exit(EXIT_FAILURE);
        /* Every other member, listed from the end: the order of a label's list is not the members'. */
        for (size_t i = 0; i < BIG_MEMBERS / 2; i++)
                half[i] = members[BIG_MEMBERS - 1 - 2 * i];
        PoolLabel labels[] = { { .name = (char *) "half", .members = half } };
        pool.members = members;
        pool.labels = labels;
        pool.n_labels = 1;
        Engine *e = engine_with(&pool);
        uint64_t *lat = calloc(MAX(n_arrivals, (size_t) 1), sizeof(uint64_t)), total = 0;
        if (!lat)
                exit(EXIT_FAILURE);
        usec_t now = 1;
        size_t granted = 0;
        for (size_t i = 0; i < n_arrivals; i++) {
                static const char *const with[] = { "half", NULL }, *const without[] = { "!half", NULL };
                const char *const *terms = NULL, *member = NULL;
                if (labelled)
                        switch (i % 3) {
                        case 0: terms = with; break;
                        case 1: terms = without; break;
                        default: terms = with; member = half[rnd() % (BIG_MEMBERS / 2)]; break;
                        }
                EngineRequest *request = NULL;
                EngineLease *lease = NULL;
                EngineEvent ev;
                now += 1000;
                uint64_t t0 = bench_now_ns();
                int r = engine_acquire(e,
                                       &(EngineAcquire) { .lane = "l", .slots = 1, .max_wait = USEC_INFINITY,
                                                          .labels = terms, .member = member },
                                       now, &request);
                if (r >= 0)
                        engine_run(e, now);
                lat[i] = bench_now_ns() - t0;
                total += lat[i];
                if (r < 0) {
                        fprintf(stderr, "acquire: %s\n", strerror(-r));
                        exit(EXIT_FAILURE);
                }
                while (engine_pop_event(e, &ev))
                        if (ev.type == ENGINE_EVENT_GRANTED) {
                                lease = ev.lease;
                                granted++;
                        }
                if (lease)
                        engine_lease_release(lease, now);
                engine_run(e, now);
                while (engine_pop_event(e, &ev))
                        ;
                engine_request_unref(request);
        }
        uint64_t reload_max = 0;
        for (size_t i = 0; i < RELOADS; i++) {
                for (size_t k = 0; k < BIG_MEMBERS / 2; k++) {
                        char *m = members[k];
                        members[k] = members[BIG_MEMBERS - 1 - k];
                        members[BIG_MEMBERS - 1 - k] = m;
                }
                now += 1000;
                uint64_t t0 = bench_now_ns();
                configure(e, &pool, now);
                reload_max = MAX(reload_max, bench_now_ns() - t0);
        }
        if (n_arrivals > 0) {
                qsort(lat, n_arrivals, sizeof(uint64_t), cmp_u64);
                printf("%-10s members %d, label on %d, arrivals %zu, grants %zu: acquire + grant p50 %.1f µs, p99 %.1f µs, "
                       "max %.1f µs, total %.1f ms; %d reloads reordering the members, the slowest %.1f ms\n",
                       labelled ? "labelled" : "unlabelled", BIG_MEMBERS, BIG_MEMBERS / 2, n_arrivals, granted,
                       lat[n_arrivals / 2] / 1e3, lat[n_arrivals * 99 / 100] / 1e3, lat[n_arrivals - 1] / 1e3, total / 1e6,
                       RELOADS, reload_max / 1e6);
        }
        engine_free(e);
        free(lat);
        free(half);
        strv_free(members);
}

/* The text of the configuration `bench-labels config` reads: short member names, so that members= of 10,000
 * fits a line (CONFIG_LINE_MAX). */
static char *config_text(bool labelled) {
        char *text = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&text, &size);
        if (!f)
                exit(EXIT_FAILURE);
        fputs("[pool fleet]\nmembers=", f);
        for (size_t i = 0; i < BIG_MEMBERS; i++)
                fprintf(f, "%sr%04zu", i ? " " : "", i);
        if (labelled) {
                fputs("\nlabel.half=", f);
                for (size_t i = 0; i < BIG_MEMBERS / 2; i++)
                        fprintf(f, "%sr%04zu", i ? " " : "", (size_t) BIG_MEMBERS - 1 - 2 * i);
                fprintf(f, "\nlabel.last=r%04d", BIG_MEMBERS - 1);
        }
        fprintf(f, "\n[lane l]\npools=fleet\n%s", labelled ? "labels=half last\n" : "");
        if (fclose(f) != 0)
                exit(EXIT_FAILURE);
        return text;
}

static void run_config(bool labelled, size_t rounds) {
        char *text = config_text(labelled);
        uint64_t slowest = 0, fastest = UINT64_MAX;
        for (size_t i = 0; i < rounds; i++) {
                BrokerConfig *c = NULL;
                ConfErrors errors = {};
                uint64_t t0 = bench_now_ns();
                int r = config_load_string(text, "bench.conf", &c, &errors);
                uint64_t t = bench_now_ns() - t0;
                if (r < 0) {
                        conf_errors_print(&errors, stderr);
                        exit(EXIT_FAILURE);
                }
                conf_errors_done(&errors);
                conf_free(c);
                slowest = MAX(slowest, t);
                fastest = MIN(fastest, t);
        }
        printf("%-10s members %d, label on %d, %zu rounds: read + validate fastest %.2f ms, slowest %.2f ms\n",
               labelled ? "labelled" : "unlabelled", BIG_MEMBERS, labelled ? BIG_MEMBERS / 2 : 0, rounds,
               fastest / 1e6, slowest / 1e6);
        free(text);
}

int main(int argc, char **argv) {
        char load[128];
        if (argc > 1 && streq(argv[1], "config")) {
                size_t rounds = argc > 2 ? strtoul(argv[2], NULL, 10) : 5;
                printf("bench-labels config: load average %s\n", bench_loadavg(load, sizeof load));
                run_config(false, rounds);
                run_config(true, rounds);
                return 0;
        }
        if (argc > 1 && streq(argv[1], "arrivals")) {
                size_t arrivals = argc > 2 ? strtoul(argv[2], NULL, 10) : 1000;
                printf("bench-labels arrivals: load average %s\n", bench_loadavg(load, sizeof load));
                run_arrivals(false, arrivals);
                run_arrivals(true, arrivals);
                return 0;
        }
        size_t waiters = argc > 1 ? strtoul(argv[1], NULL, 10) : 10000;
        size_t releases = argc > 2 ? strtoul(argv[2], NULL, 10) : 5000;
        printf("bench-labels: load average %s\n", bench_loadavg(load, sizeof load));
        run(false, waiters, releases);
        run(true, waiters, releases);
        return 0;
}
