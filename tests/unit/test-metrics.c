/* SPDX-License-Identifier: MIT */
/* test-metrics.c — the exposition text's escaping, and metrics-textfile= on a disk that stalls (metrics.h): a write still under way is not joined
 * by another every 15 s, each a thread holding a copy of the text (a day of a hung NFS mount: thousands,
 * and TasksMax= reached for the closer's threads too), nor overtaken by a newer one, whose file an older
 * rename would then replace: counters that go back. The disk stalls in fsync(), which this executable
 * defines for brokerd's code to call, behind a gate the test opens. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "macro.h"
#include "metrics.h"

static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_changed = PTHREAD_COND_INITIALIZER;
static bool gate_closed;
static unsigned fsyncs;

int fsync(int fd) {
        pthread_mutex_lock(&gate_lock);
        fsyncs++;
        pthread_cond_broadcast(&gate_changed);
        while (gate_closed)
                pthread_cond_wait(&gate_changed, &gate_lock);
        pthread_mutex_unlock(&gate_lock);
        return (int) syscall(SYS_fsync, fd);
}

static void gate_set(bool closed) {
        pthread_mutex_lock(&gate_lock);
        gate_closed = closed;
        pthread_cond_broadcast(&gate_changed);
        pthread_mutex_unlock(&gate_lock);
}

static void wait_fsyncs(unsigned n) {
        pthread_mutex_lock(&gate_lock);
        while (fsyncs < n)
                pthread_cond_wait(&gate_changed, &gate_lock);
        pthread_mutex_unlock(&gate_lock);
}

static unsigned threads(void) {
        DIR *d = opendir("/proc/self/task");
        assert_non_null(d);
        unsigned n = 0;
        for (struct dirent *e; (e = readdir(d));)
                n += e->d_name[0] != '.';
        closedir(d);
        return n;
}

static void sleep_briefly(void) {
        nanosleep(&(struct timespec) { .tv_nsec = 1000000 }, NULL);
}

/* Waits (10 s at most) for the writer's thread to be gone. */
static void wait_threads(unsigned n) {
        for (unsigned i = 0; i < 10000 && threads() != n; i++)
                sleep_briefly();
        assert_int_equal(threads(), n);
}

/* Waits (10 s at most) for the textfile to say denied_total is v. */
static void wait_denied(const char *path, unsigned v) {
        char want[64];
        snprintf(want, sizeof want, "\nslotbroker_denied_total %u\n", v);
        for (unsigned i = 0; i < 10000; i++) {
                _cleanup_free_ char *text = NULL;
                size_t size = 0;
                FILE *f = fopen(path, "re");
                if (f) {
                        ssize_t n = getdelim(&text, &size, '\0', f);
                        fclose(f);
                        if (n > 0 && strstr(text, want))
                                return;
                }
                sleep_briefly();
        }
        fail_msg("%s never said %s", path, want + 1);
}

static void test_one_textfile_write_at_a_time(void **state) {
        char dir[] = "/tmp/test-metrics-XXXXXX";
        assert_non_null(mkdtemp(dir));
        _cleanup_free_ char *path = NULL;
        assert_true(asprintf(&path, "%s/slotbroker.prom", dir) > 0);
        Metrics m = {};
        MetricsGauges g = {};
        unsigned before = threads();

        gate_set(true);
        m.denied = 1;
        metrics_write_textfile(&m, &g, path);
        wait_fsyncs(1); /* the first write is stuck in the disk */
        m.denied = 2;
        metrics_write_textfile(&m, &g, path);
        /* No second thread, stuck behind the first: the text goes at the next interval. */
        assert_int_equal(threads(), before + 1);

        gate_set(false);
        wait_denied(path, 1);
        wait_threads(before);
        assert_int_equal(fsyncs, 1);
        /* The disk is back: the next interval writes. */
        m.denied = 3;
        metrics_write_textfile(&m, &g, path);
        wait_denied(path, 3);
        wait_threads(before);
        assert_int_equal(fsyncs, 2);

        assert_int_equal(unlink(path), 0);
        assert_int_equal(rmdir(dir), 0);
        metrics_done(&m);
}

/* Label values escaped as the exposition format wants (backslash, quote, newline), written in runs between
 * them: conf.c allows none of these in a name, but the renderer does not rely on it. And a histogram's +Inf
 * bucket and _count are the observations, its buckets cumulative. */
static void test_render_escapes_label_values(void **state) {
        Metrics m = {};
        MetricsGauges g = {};
        const char *pool = "a\"b\\c\nd";
        metrics_record(&m, &(AuditRecord) { .decision = "granted", .pool = pool, .lane = "\\", .wait = 2 * USEC_PER_SEC });
        metrics_record(&m, &(AuditRecord) { .decision = "granted", .pool = pool, .lane = "\\", .wait = 1000 });
        metrics_record(&m, &(AuditRecord) { .decision = "busy", .pool = "plain", .lane = "\"", .wait = 0 });
        _cleanup_free_ char *text = NULL;
        assert_int_equal(metrics_render(&m, &g, &text), 0);
        /* The pool's label as it is written: a\"b\\c\nd. */
        static const char *const lines[] = {
                "slotbroker_granted_total{pool=\"a\\\"b\\\\c\\nd\",lane=\"\\\\\"} 2",
                "slotbroker_rejected_total{pool=\"plain\",lane=\"\\\"\",reason=\"busy\"} 1",
                "slotbroker_wait_seconds_bucket{pool=\"a\\\"b\\\\c\\nd\",le=\"0.001\"} 1",
                "slotbroker_wait_seconds_bucket{pool=\"a\\\"b\\\\c\\nd\",le=\"1\"} 1",
                "slotbroker_wait_seconds_bucket{pool=\"a\\\"b\\\\c\\nd\",le=\"5\"} 2",
                "slotbroker_wait_seconds_bucket{pool=\"a\\\"b\\\\c\\nd\",le=\"+Inf\"} 2",
                "slotbroker_wait_seconds_count{pool=\"a\\\"b\\\\c\\nd\"} 2",
        };
        for (size_t i = 0; i < ELEMENTSOF(lines); i++) {
                _cleanup_free_ char *line = NULL;
                assert_true(asprintf(&line, "\n%s\n", lines[i]) > 0);
                if (!strstr(text, line))
                        fail_msg("no line %s in:\n%s", lines[i], text);
        }
        metrics_done(&m);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_render_escapes_label_values),
                cmocka_unit_test(test_one_textfile_write_at_a_time),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
