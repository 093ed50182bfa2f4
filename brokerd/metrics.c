/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"

static const double wait_bounds[METRICS_WAIT_BUCKETS] = { 0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600 };
static const double hold_bounds[METRICS_HOLD_BUCKETS] = { 1, 10, 30, 60, 300, 900, 1800, 3600, 7200, 14400, 86400 };
static const double rtt_bounds[METRICS_RTT_BUCKETS] = { 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                        0.05, 0.1, 0.5, 2 };
_Static_assert(METRICS_RTT_BUCKETS <= ELEMENTSOF(((MetricsHistogram *) NULL)->counts), "rtt buckets fit");

void metrics_done(Metrics *m) {
        for (size_t i = 0; i < m->n_series; i++) {
                free(m->series[i].pool);
                free(m->series[i].lane);
                free(m->series[i].reason);
        }
        for (size_t i = 0; i < m->n_pools; i++)
                free(m->pools[i].pool);
        free(m->series);
        free(m->pools);
        *m = (Metrics) {};
}

static MetricsSeries *series_get(Metrics *m, const char *pool, const char *lane, const char *reason) {
        for (size_t i = 0; i < m->n_series; i++) {
                MetricsSeries *s = &m->series[i];
                if (streq(s->pool, pool) && streq(s->lane, lane) && streq_ptr(s->reason, reason))
                        return s;
        }
        MetricsSeries *a = reallocarray(m->series, m->n_series + 1, sizeof(MetricsSeries));
        if (!a)
                return NULL;
        m->series = a;
        MetricsSeries *s = &a[m->n_series];
        *s = (MetricsSeries) { .pool = strdup(pool), .lane = strdup(lane), .reason = reason ? strdup(reason) : NULL };
        if (!s->pool || !s->lane || (reason && !s->reason)) {
                free(s->pool);
                free(s->lane);
                free(s->reason);
                return NULL;
        }
        m->n_series++;
        return s;
}

static MetricsPool *pool_get(Metrics *m, const char *pool) {
        for (size_t i = 0; i < m->n_pools; i++)
                if (streq(m->pools[i].pool, pool))
                        return &m->pools[i];
        MetricsPool *a = reallocarray(m->pools, m->n_pools + 1, sizeof(MetricsPool));
        if (!a)
                return NULL;
        m->pools = a;
        a[m->n_pools] = (MetricsPool) { .pool = strdup(pool) };
        if (!a[m->n_pools].pool)
                return NULL;
        return &a[m->n_pools++];
}

static void histogram_observe(MetricsHistogram *h, const double *bounds, size_t n, double v) {
        for (size_t i = 0; i < n; i++)
                if (v <= bounds[i])
                        h->counts[i]++; /* cumulative, as Prometheus wants the buckets */
        h->total++;
        h->sum += v;
}

static bool is_refusal(const char *d) {
        return streq(d, "busy") || streq(d, "full") || streq(d, "timeout") || streq(d, "shed") ||
               streq(d, "unavailable");
}

void metrics_record(Metrics *m, const AuditRecord *r) {
        if (streq(r->decision, "denied")) {
                m->denied++;
                return;
        }
        if (!r->pool || !r->lane)
                return;
        if (streq(r->decision, "granted")) {
                MetricsSeries *s = series_get(m, r->pool, r->lane, NULL);
                if (s)
                        s->count++;
                MetricsPool *p = pool_get(m, r->pool);
                if (p && r->wait != USEC_INFINITY)
                        histogram_observe(&p->wait, wait_bounds, METRICS_WAIT_BUCKETS, (double) r->wait / 1e6);
        } else if (is_refusal(r->decision)) {
                MetricsSeries *s = series_get(m, r->pool, r->lane, r->decision);
                if (s)
                        s->count++;
        } else if (streq(r->decision, "released") && r->hold != USEC_INFINITY) {
                /* Every lease ends with exactly one release (a revoked one too, when its slots free). */
                MetricsPool *p = pool_get(m, r->pool);
                if (p)
                        histogram_observe(&p->hold, hold_bounds, METRICS_HOLD_BUCKETS, (double) r->hold / 1e6);
        }
}

void metrics_backend_rtt(Metrics *m, const char *pool, usec_t rtt) {
        MetricsPool *p = pool_get(m, pool);
        if (p)
                histogram_observe(&p->rtt, rtt_bounds, METRICS_RTT_BUCKETS, (double) rtt / 1e6);
}

/* Label values: backslash, quote and newline escaped (the exposition format's rules), the runs between them
 * written whole: a member pool's families have a label value a line per member, and a character at a time
 * was a third of a scrape's cost. */
static void put_label(FILE *f, const char *v) {
        for (;;) {
                size_t n = strcspn(v, "\\\"\n");
                fwrite(v, 1, n, f);
                v += n;
                if (!*v)
                        return;
                fputs(*v == '\\' ? "\\\\" : *v == '"' ? "\\\"" : "\\n", f);
                v++;
        }
}

static void header(FILE *f, const char *name, const char *type, const char *help) {
        fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void pool_value(FILE *f, const char *name, const char *pool, uint64_t v) {
        fprintf(f, "%s{pool=\"", name);
        put_label(f, pool);
        fprintf(f, "\"} %llu\n", (unsigned long long) v);
}

static void histogram(FILE *f, const char *name, const char *pool, const MetricsHistogram *h, const double *bounds,
                      size_t n) {
        for (size_t i = 0; i < n; i++) {
                fprintf(f, "%s_bucket{pool=\"", name);
                put_label(f, pool);
                fprintf(f, "\",le=\"%g\"} %llu\n", bounds[i], (unsigned long long) h->counts[i]);
        }
        fprintf(f, "%s_bucket{pool=\"", name);
        put_label(f, pool);
        fprintf(f, "\",le=\"+Inf\"} %llu\n", (unsigned long long) h->total);
        fprintf(f, "%s_sum{pool=\"", name);
        put_label(f, pool);
        fprintf(f, "\"} %.6f\n", h->sum);
        fprintf(f, "%s_count{pool=\"", name);
        put_label(f, pool);
        fprintf(f, "\"} %llu\n", (unsigned long long) h->total);
}

int metrics_render(const Metrics *m, const MetricsGauges *g, char **ret) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);
        if (!f)
                return -ENOMEM;
        (void) __fsetlocking(f, FSETLOCKING_BYCALLER); /* this thread's alone: no lock taken a call */
        size_t n = engine_pool_count(g->engine);
        EnginePoolInfo info;

        /* Every family is named beside its type, here and in header()'s calls: brokerd(8) METRICS lists them
         * all, and tests/check-man-metrics.py holds the two to each other. */
        static const struct {
                const char *name, *type, *help;
        } gauges[] = {
                { "slotbroker_slots", "gauge", "Slots in the pool (its limit)." },
                { "slotbroker_slots_in_use", "gauge", "Slots held by leases." },
                { "slotbroker_queue_length", "gauge", "Requests waiting in the pool's queue." },
                { "slotbroker_queue_congested", "gauge", "1 while a new request would be queued with the saturated budget." },
                { "slotbroker_slots_resting", "gauge", "Slots resting after a release (cooldown=): neither free nor held." },
        };
        for (size_t k = 0; k < ELEMENTSOF(gauges); k++) {
                header(f, gauges[k].name, gauges[k].type, gauges[k].help);
                for (size_t i = 0; i < n; i++) {
                        if (engine_pool_info(g->engine, i, g->now, &info) < 0)
                                continue;
                        /* A shared pool's slots are its agreed rules', which Redis enforces: not the own limit
                         * of a node whose rules differ. */
                        unsigned slots = info.remote && info.agreed_limit > 0 ? info.agreed_limit : info.limit;
                        uint64_t v = k == 0 ? slots : k == 1 ? info.in_use : k == 2 ? info.waiting
                                   : k == 3 ? info.congested : info.n_resting;
                        pool_value(f, gauges[k].name, info.name, v);
                }
        }

        /* SPEC §3.6: each member of a member pool, from the engine (kept by name across reloads, and across
         * restarts through the lease log's "use" records: issue 23 "everything persists"). */
        static const struct {
                const char *name, *type, *help;
        } member_series[] = {
                { "slotbroker_member_quarantined", "gauge", "1 while the member is quarantined." },
                { "slotbroker_member_quarantines_total", "counter", "Times the member was quarantined." },
                { "slotbroker_member_grants_total", "counter", "Leases granted the member." },
                { "slotbroker_member_held_seconds_total", "counter", "Seconds the member was held, by leases that ended." },
        };
        for (size_t k = 0; k < ELEMENTSOF(member_series); k++) {
                header(f, member_series[k].name, member_series[k].type, member_series[k].help);
                for (size_t i = 0; i < n; i++) {
                        if (engine_pool_info(g->engine, i, g->now, &info) < 0)
                                continue;
                        /* A shared pool: the quarantined gauge is the fleet's (Redis), the counters this node's own
                         * (its leases, the quarantines its calls made): Prometheus sums the nodes. */
                        for (size_t j = 0; j < info.n_life; j++) {
                                const EngineMemberLife *l = info.life + j;
                                fprintf(f, "%s{pool=\"", member_series[k].name);
                                put_label(f, info.name);
                                fputs("\",member=\"", f);
                                put_label(f, l->member);
                                if (k == 3)
                                        fprintf(f, "\"} %.6f\n", (double) l->held / USEC_PER_SEC);
                                else
                                        fprintf(f, "\"} %llu\n",
                                                (unsigned long long) (k == 0 ? l->quarantined : k == 1 ? l->quarantines : l->grants));
                        }
                }
        }

        header(f, "slotbroker_granted_total", "counter", "Requests granted, by pool and lane.");
        for (size_t i = 0; i < m->n_series; i++) {
                const MetricsSeries *s = &m->series[i];
                if (s->reason)
                        continue;
                fputs("slotbroker_granted_total{pool=\"", f);
                put_label(f, s->pool);
                fputs("\",lane=\"", f);
                put_label(f, s->lane);
                fprintf(f, "\"} %llu\n", (unsigned long long) s->count);
        }
        header(f, "slotbroker_rejected_total", "counter", "Requests refused, by pool, lane and reason.");
        for (size_t i = 0; i < m->n_series; i++) {
                const MetricsSeries *s = &m->series[i];
                if (!s->reason)
                        continue;
                fputs("slotbroker_rejected_total{pool=\"", f);
                put_label(f, s->pool);
                fputs("\",lane=\"", f);
                put_label(f, s->lane);
                fputs("\",reason=\"", f);
                put_label(f, s->reason);
                fprintf(f, "\"} %llu\n", (unsigned long long) s->count);
        }
        header(f, "slotbroker_wait_seconds", "histogram", "Time granted requests waited.");
        for (size_t i = 0; i < m->n_pools; i++)
                histogram(f, "slotbroker_wait_seconds", m->pools[i].pool, &m->pools[i].wait, wait_bounds,
                          METRICS_WAIT_BUCKETS);
        header(f, "slotbroker_hold_seconds", "histogram", "Time leases were held.");
        for (size_t i = 0; i < m->n_pools; i++)
                histogram(f, "slotbroker_hold_seconds", m->pools[i].pool, &m->pools[i].hold, hold_bounds,
                          METRICS_HOLD_BUCKETS);

        bool any_remote = false;
        for (size_t i = 0; i < n; i++)
                if (engine_pool_info(g->engine, i, g->now, &info) >= 0 && info.remote) {
                        if (!any_remote)
                                header(f, "slotbroker_backend_up", "gauge",
                                       "1 while a shared pool is served: its backend reached, the rules agreed.");
                        any_remote = true;
                        pool_value(f, "slotbroker_backend_up", info.name, info.backend_up);
                }
        bool any_bad = false;
        for (size_t i = 0; i < n; i++)
                if (engine_pool_info(g->engine, i, g->now, &info) >= 0 && info.remote) {
                        if (!any_bad)
                                header(f, "slotbroker_backend_bad_input_total", "counter",
                                       "Replies and stream entries of a shared pool's backend that failed validation and were dropped.");
                        any_bad = true;
                        pool_value(f, "slotbroker_backend_bad_input_total", info.name, info.bad_input);
                }
        bool any_failover = false;
        for (size_t i = 0; g->backend_primary && i < n; i++) {
                BackendPrimary bp;
                if (engine_pool_info(g->engine, i, g->now, &info) < 0 || !info.remote ||
                    !g->backend_primary(info.name, &bp, g->backend_primary_userdata))
                        continue;
                if (!any_failover)
                        header(f, "slotbroker_backend_failovers_total", "counter",
                               "Failovers of a shared pool's primary seen through its Sentinels.");
                any_failover = true;
                pool_value(f, "slotbroker_backend_failovers_total", info.name, bp.failovers);
        }
        bool any_rtt = false;
        for (size_t i = 0; i < m->n_pools; i++) {
                if (m->pools[i].rtt.total == 0)
                        continue;
                if (!any_rtt)
                        header(f, "slotbroker_backend_rtt_seconds", "histogram",
                               "Round trips of a shared pool's calls to its backend.");
                any_rtt = true;
                histogram(f, "slotbroker_backend_rtt_seconds", m->pools[i].pool, &m->pools[i].rtt, rtt_bounds,
                          METRICS_RTT_BUCKETS);
        }

        header(f, "slotbroker_denied_total", "counter", "Requests refused by a lane's access list.");
        fprintf(f, "slotbroker_denied_total %llu\n", (unsigned long long) m->denied);
        header(f, "slotbroker_connections", "gauge", "Open client connections.");
        fprintf(f, "slotbroker_connections %u\n", g->connections);
        header(f, "slotbroker_connections_paused", "gauge",
               "Client connections not read while their user has max-closing-fds-per-uid fds waiting to be closed.");
        fprintf(f, "slotbroker_connections_paused %u\n", g->connections_paused);
        header(f, "slotbroker_closing_fds", "gauge", "File descriptors clients passed that wait to be closed.");
        fprintf(f, "slotbroker_closing_fds %u\n", g->closing_fds);
        header(f, "slotbroker_connections_refused_total", "counter",
               "Connections closed at once because max-connections or max-connections-per-uid was reached.");
        fprintf(f, "slotbroker_connections_refused_total %llu\n", (unsigned long long) m->connections_refused);
        header(f, "slotbroker_accept_fd_exhausted_total", "counter",
               "Times brokerd ran out of file descriptors to accept connections with, and paused accepting.");
        fprintf(f, "slotbroker_accept_fd_exhausted_total %llu\n", (unsigned long long) m->accept_fd_exhausted);
        header(f, "slotbroker_leases", "gauge", "Leases, held or waiting for their command to end.");
        fprintf(f, "slotbroker_leases %u\n", g->leases);
        header(f, "slotbroker_journal_dropped_total", "counter", "Audit entries journald did not take in time.");
        fprintf(f, "slotbroker_journal_dropped_total %lu\n", g->journal_dropped);
        if (g->history) {
                header(f, "slotbroker_history_healthy", "gauge", "1 while the history database can be written.");
                fprintf(f, "slotbroker_history_healthy %d\n", g->history_healthy);
                header(f, "slotbroker_history_rows_dropped_total", "counter", "History rows lost to a full backlog.");
                fprintf(f, "slotbroker_history_rows_dropped_total %llu\n", (unsigned long long) g->history_rows_dropped);
                header(f, "slotbroker_history_rows_pending", "gauge",
                       "History rows not written yet: waiting for the writer's next batch, or retried.");
                fprintf(f, "slotbroker_history_rows_pending %llu\n", (unsigned long long) g->history_rows_pending);
        }
        if (fclose(f) != 0) {
                free(buf);
                return -ENOMEM;
        }
        *ret = buf;
        return 0;
}

typedef struct TextfileJob {
        char *path;
        char *text;
} TextfileJob;

/* A fresh temporary name beside the textfile: "NAME.tmp.<16 hex digits>", never one a user of the directory
 * can predict and plant a symlink at. */
static int textfile_temporary_name(const char *base, char **ret) {
        uint64_t r;
        if (getrandom(&r, sizeof r, 0) != (ssize_t) sizeof r)
                return -errno ?: -EIO;
        return asprintf(ret, "%s.tmp.%016" PRIx64, base, r) < 0 ? -ENOMEM : 0;
}

/* Writes all of text to fd and flushes it to disk. */
static int write_all_and_sync(int fd, const char *text) {
        size_t len = strlen(text);
        while (len > 0) {
                ssize_t n = write(fd, text, len);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return n < 0 ? -errno : -EIO;
                text += n;
                len -= (size_t) n;
        }
        return fsync(fd) < 0 ? -errno : 0;
}

/* Gives the complete unnamed O_TMPFILE fd a new temporary name in dfd. linkat() never follows or replaces
 * what is at the new name: a planted file or symlink only costs another name. */
static int textfile_link(int fd, int dfd, const char *base, char **ret) {
        char proc[64];
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
        for (unsigned attempt = 0; attempt < 16; attempt++) {
                _cleanup_free_ char *name = NULL;
                int r = textfile_temporary_name(base, &name);
                if (r < 0)
                        return r;
                if (linkat(AT_FDCWD, proc, dfd, name, AT_SYMLINK_FOLLOW) >= 0) {
                        *ret = TAKE_PTR(name);
                        return 0;
                }
                if (errno != EEXIST)
                        return -errno;
        }
        return -EEXIST;
}

/* The fallback where O_TMPFILE is not supported: a random name created with O_EXCL|O_NOFOLLOW, which fails
 * rather than open anything already there. */
static int textfile_create(int dfd, const char *base, char **ret_name) {
        for (unsigned attempt = 0; attempt < 16; attempt++) {
                _cleanup_free_ char *name = NULL;
                int r = textfile_temporary_name(base, &name);
                if (r < 0)
                        return r;
                int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
                if (fd >= 0) {
                        *ret_name = TAKE_PTR(name);
                        return fd;
                }
                if (errno != EEXIST)
                        return -errno;
        }
        return -EEXIST;
}

/* Replaces path with text atomically. The directory may be writable by others (a node_exporter textfile
 * directory often is): the data goes into an unnamed O_TMPFILE and gets a random name only once complete,
 * so nothing planted in the directory is ever opened or written through; rename() then replaces whatever
 * is at path, a symlink included, and does not follow it. */
static int textfile_write(const char *path, const char *text) {
        _cleanup_free_ char *copy = strdup(path), *name = NULL;
        _cleanup_close_ int dfd = -EBADF, fd = -EBADF;
        int r;

        if (!copy)
                return -ENOMEM;
        char *slash = strrchr(copy, '/');
        const char *base = slash ? slash + 1 : copy;
        if (slash)
                *slash = '\0';
        dfd = open(!slash ? "." : slash == copy ? "/" : copy, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return -errno;

        fd = openat(dfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
        if (fd >= 0) {
                r = write_all_and_sync(fd, text);
                if (r >= 0)
                        r = textfile_link(fd, dfd, base, &name);
        } else
                r = -errno;
        /* No O_TMPFILE on this file system or kernel (older ones say EISDIR or EINVAL), or no /proc to link
         * it from: a named temporary file, created safely. */
        if ((r == -EOPNOTSUPP || r == -EISDIR || r == -EINVAL || r == -ENOENT) && !name) {
                fd = safe_close(fd);
                fd = r = textfile_create(dfd, base, &name);
                if (r >= 0)
                        r = write_all_and_sync(fd, text);
        }
        if (r >= 0 && renameat(dfd, name, dfd, base) < 0)
                r = -errno;
        if (r < 0 && name)
                (void) unlinkat(dfd, name, 0);
        return r;
}

/* A write is under way. One at a time: on a disk that stalls (a hung NFS mount) a thread every interval would
 * pile up for ever, each holding a text, and an older write that ends last would replace a newer file. */
static atomic_bool textfile_busy;

static void textfile_job_free(TextfileJob *job) {
        free(job->path);
        free(job->text);
        free(job);
}

/* Runs off the loop: the metrics file lives on a disk the loop must never wait for. A failed write is
 * retried at the next interval; the loop has nobody to tell. */
static void *textfile_thread(void *p) {
        TextfileJob *job = p;
        (void) textfile_write(job->path, job->text);
        textfile_job_free(job);
        atomic_store(&textfile_busy, false);
        return NULL;
}

void metrics_write_textfile(const Metrics *m, const MetricsGauges *g, const char *path) {
        if (atomic_exchange(&textfile_busy, true))
                return; /* the last one still writes: the next interval has the newer text */
        TextfileJob *job = calloc(1, sizeof(TextfileJob));
        if (!job) {
                atomic_store(&textfile_busy, false);
                return;
        }
        job->path = strdup(path);
        if (!job->path || metrics_render(m, g, &job->text) < 0) {
                textfile_job_free(job);
                atomic_store(&textfile_busy, false);
                return;
        }
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, textfile_thread, job) != 0) {
                textfile_job_free(job);
                atomic_store(&textfile_busy, false);
        }
        pthread_attr_destroy(&attr);
}
