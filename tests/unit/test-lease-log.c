/* SPDX-License-Identifier: MIT */
/* test-lease-log.c — the lease log alone (lease-log.h), in a temporary directory: what is written is what
 * a restart reads; a torn last line, a damaged line, a file that is not a lease log; a write that fails
 * half-way (RLIMIT_FSIZE) leaves no half line and a broken log that a snapshot mends; rewrites. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "crc32-reference.h"
#include "lease-log.h"

typedef struct Fixture {
        char dir[64];
        char path[128];
        LeaseLog *log;
} Fixture;

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof(Fixture));
        assert_non_null(f);
        strcpy(f->dir, "/tmp/test-lease-log.XXXXXX");
        assert_non_null(mkdtemp(f->dir));
        snprintf(f->path, sizeof f->path, "%s/" LEASE_LOG_FILE, f->dir);
        HistoryState none = {};
        assert_int_equal(lease_log_new(f->dir, &none, 0, &f->log), 0);
        assert_true(lease_log_is_broken(f->log)); /* until its first snapshot */
        assert_int_equal(lease_log_rewrite(f->log, NULL, 0, 0), 0);
        assert_false(lease_log_is_broken(f->log));
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        char cmd[128];
        lease_log_free(f->log);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
        assert_int_equal(system(cmd), 0);
        free(f);
        return 0;
}

static unsigned slots_a[] = { 0, 3 };
static char *members_a[] = { "grid-1", NULL };

static HistoryLeaseRow row_a(void) {
        return (HistoryLeaseRow) {
                .id = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                .pool = "p",
                .lane = "merge",
                .slots = slots_a,
                .members = members_a,
                .n_slots = 2,
                .token = 41,
                .job = "say \"hi\"\\\n\x01 ünïcode",
                .uid = 1000,
                .pid = 77,
                .command_pid = 78,
                .command_start_time = 123456789,
                .detached = false,
                .granted_at = 1700000000000001,
                .expires_at = 1700000060000001,
                /* Its pool's quarantine-exit-codes = 3 64 255, quarantine-after = 2: a restart whose configuration
                 * lacks the pool judges the exit by them. */
                .quarantine_exit_codes = { UINT64_C(1) << 3, UINT64_C(1), 0, UINT64_C(1) << 63 },
                .quarantine_after = 2,
        };
}

static unsigned slots_b[] = { 1 };

static HistoryLeaseRow row_b(const char *id, uint64_t token) {
        return (HistoryLeaseRow) {
                .id = (char *) id,
                .pool = "q",
                .lane = "nightly",
                .slots = slots_b,
                .n_slots = 1,
                .token = token,
                .uid = 0,
                .pid = 5,
                .detached = true,
                .health_known = true,
                .health = true, /* a health job's lease (health = also): a restart keeps it one */
                .granted_at = 1700000000000002,
                .expires_at = USEC_INFINITY,
        };
}

static const HistoryTokenFloor *floor_of(const HistoryState *s, const char *pool) {
        for (size_t i = 0; i < s->n_floors; i++)
                if (streq(s->floors[i].pool, pool))
                        return &s->floors[i];
        return NULL;
}

static const HistoryLeaseRow *lease_of(const HistoryState *s, const char *id) {
        for (size_t i = 0; i < s->n_leases; i++)
                if (streq(s->leases[i].id, id))
                        return &s->leases[i];
        return NULL;
}

static void read_back(Fixture *f, HistoryState *s, LeaseLogRead *info) {
        assert_int_equal(lease_log_read(f->dir, s, info), 0);
        assert_true(info->exists);
}

static void test_what_is_written_is_read(void **state) {
        Fixture *f = *state;
        HistoryLeaseRow a = row_a(), b = row_b("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", 7),
                        c = row_b("cccccccccccccccccccccccccccccccc", 9);
        assert_int_equal(lease_log_add(f->log, &a), 0);
        assert_int_equal(lease_log_add(f->log, &b), 0);
        assert_int_equal(lease_log_add(f->log, &c), 0);
        assert_int_equal(lease_log_end(f->log, b.id), 0);
        assert_int_equal(lease_log_alive(f->log, 1700000005000000), 0);
        assert_true(lease_log_has_pending(f->log));
        /* Nothing reaches the file before the flush. */
        HistoryState s = {};
        LeaseLogRead info;
        read_back(f, &s, &info);
        assert_int_equal(s.n_leases, 0);
        history_state_done(&s);

        assert_int_equal(lease_log_flush(f->log), 0);
        assert_false(lease_log_has_pending(f->log));
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, 0);
        assert_int_equal(s.n_leases, 2);
        const HistoryLeaseRow *ra = lease_of(&s, a.id), *rc = lease_of(&s, c.id);
        assert_non_null(ra);
        assert_non_null(rc);
        assert_null(lease_of(&s, b.id));
        assert_string_equal(ra->pool, "p");
        assert_string_equal(ra->lane, "merge");
        assert_int_equal(ra->n_slots, 2);
        assert_int_equal(ra->slots[1], 3);
        assert_non_null(ra->members);
        assert_string_equal(ra->members[0], "grid-1");
        assert_null(ra->members[1]);
        assert_string_equal(ra->job, a.job);
        assert_int_equal(ra->token, 41);
        assert_int_equal(ra->uid, 1000);
        assert_int_equal(ra->pid, 77);
        assert_int_equal(ra->command_pid, 78);
        assert_int_equal(ra->command_start_time, 123456789);
        assert_false(ra->detached);
        assert_true(ra->health_known);
        assert_false(ra->health);
        assert_int_equal(ra->granted_at, a.granted_at);
        assert_int_equal(ra->expires_at, a.expires_at);
        assert_memory_equal(ra->quarantine_exit_codes, a.quarantine_exit_codes, sizeof a.quarantine_exit_codes);
        assert_int_equal(ra->quarantine_after, 2);
        assert_int_equal(rc->quarantine_after, 0); /* none recorded: none */
        assert_int_equal(rc->quarantine_exit_codes[0] | rc->quarantine_exit_codes[3], 0);
        assert_null(rc->members);
        assert_null(rc->job);
        assert_true(rc->detached);
        assert_true(rc->health);
        assert_int_equal(rc->expires_at, USEC_INFINITY);
        assert_int_equal(s.alive_at, 1700000005000000);
        /* Every token given out stays below its pool's mark, the ended lease's too. */
        assert_int_equal(floor_of(&s, "p")->next_token, 42);
        assert_int_equal(floor_of(&s, "q")->next_token, 10);
        history_state_done(&s);
}

/* brokerd writes alive marks only while it holds a lease (manager.c's tick): a grant after a long idle
 * spell, then a crash before the next tick's mark, must not leave a restart with the mark of before the
 * spell (a shared pool's restored lease would fence from it at once). The lease line says brokerd ran then. */
static void test_a_grant_after_the_last_mark_counts_as_one(void **state) {
        Fixture *f = *state;
        HistoryLeaseRow a = row_a(), b = row_b("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", 7);
        assert_int_equal(lease_log_alive(f->log, a.granted_at - 600 * USEC_PER_SEC), 0);
        assert_int_equal(lease_log_add(f->log, &b), 0); /* granted 1 µs after a: the newest */
        assert_int_equal(lease_log_add(f->log, &a), 0);
        assert_int_equal(lease_log_flush(f->log), 0);
        HistoryState s = {};
        LeaseLogRead info;
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, 0);
        assert_int_equal(s.alive_at, b.granted_at);
        history_state_done(&s);

        /* A later mark is later still; an ended lease's line still said brokerd ran when it was granted. */
        assert_int_equal(lease_log_end(f->log, b.id), 0);
        assert_int_equal(lease_log_alive(f->log, b.granted_at + 5), 0);
        assert_int_equal(lease_log_flush(f->log), 0);
        read_back(f, &s, &info);
        assert_int_equal(s.alive_at, b.granted_at + 5);
        history_state_done(&s);
}

static void test_token_marks_outlive_their_leases(void **state) {
        Fixture *f = *state;
        HistoryLeaseRow b = row_b("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", 500);
        assert_int_equal(lease_log_add(f->log, &b), 0);
        assert_int_equal(lease_log_end(f->log, b.id), 0);
        assert_int_equal(lease_log_flush(f->log), 0);
        assert_int_equal(lease_log_token_mark(f->log, "q"), 501);
        /* A snapshot without the lease keeps its pool's mark. */
        assert_int_equal(lease_log_rewrite(f->log, NULL, 0, 0), 0);
        HistoryState s = {};
        LeaseLogRead info;
        read_back(f, &s, &info);
        assert_int_equal(s.n_leases, 0);
        assert_int_equal(floor_of(&s, "q")->next_token, 501);
        history_state_done(&s);
}

static void append_raw(Fixture *f, const char *text) {
        int fd = open(f->path, O_WRONLY | O_APPEND | O_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, text, strlen(text)), (ssize_t) strlen(text));
        close(fd);
}

/* How many lines of the log hold this text. */
static unsigned lines_with(Fixture *f, const char *text) {
        FILE *file = fopen(f->path, "re");
        char line[1024];
        unsigned n = 0;

        assert_non_null(file);
        while (fgets(line, sizeof line, file))
                n += strstr(line, text) != NULL;
        fclose(file);
        return n;
}

/* An all-or-nothing lease (SPEC §3.5, also=): its further pools' slots and tokens come back with it, and raise
 * their pools' token marks. */
static void test_also_pools_of_a_lease_are_read_back(void **state) {
        Fixture *f = *state;
        static unsigned slots_db[] = { 0 }, slots_lic[] = { 1, 2 };
        static char *members_lic[] = { "l2", "l3" };
        HistoryLeaseAlso also[] = {
                { .pool = "db", .slots = slots_db, .n_slots = 1, .token = 12 },
                { .pool = "lic", .slots = slots_lic, .n_slots = 2, .members = members_lic, .token = 99,
                  .remote_id = "node1:99" },
        };
        HistoryLeaseRow a = row_a();
        a.also = also;
        a.n_also = 2;
        assert_int_equal(lease_log_add(f->log, &a), 0);
        assert_int_equal(lease_log_flush(f->log), 0);
        HistoryState s = {};
        LeaseLogRead info;
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, 0);
        const HistoryLeaseRow *ra = lease_of(&s, a.id);
        assert_non_null(ra);
        assert_int_equal(ra->n_also, 2);
        assert_string_equal(ra->also[0].pool, "db");
        assert_int_equal(ra->also[0].n_slots, 1);
        assert_int_equal(ra->also[0].slots[0], 0);
        assert_null(ra->also[0].members);
        assert_int_equal(ra->also[0].token, 12);
        assert_null(ra->also[0].remote_id);
        assert_string_equal(ra->also[1].pool, "lic");
        assert_int_equal(ra->also[1].slots[1], 2);
        assert_string_equal(ra->also[1].members[0], "l2");
        assert_int_equal(ra->also[1].token, 99);
        /* A shared pool's share keeps its name at the backend: reclaimed by it after a restart. */
        assert_non_null(ra->also[1].remote_id);
        assert_string_equal(ra->also[1].remote_id, "node1:99");
        assert_int_equal(floor_of(&s, "db")->next_token, 13);
        assert_int_equal(floor_of(&s, "lic")->next_token, 100);
        assert_int_equal(lease_log_token_mark(f->log, "lic"), 100);
        history_state_done(&s);
        /* A snapshot keeps them too. */
        assert_int_equal(lease_log_rewrite(f->log, &a, 1, 0), 0);
        read_back(f, &s, &info);
        assert_int_equal(lease_of(&s, a.id)->n_also, 2);
        assert_string_equal(lease_of(&s, a.id)->also[1].remote_id, "node1:99");
        history_state_done(&s);
}

static void test_torn_last_line_is_not_damage(void **state) {
        Fixture *f = *state;
        HistoryLeaseRow b = row_b("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", 3);
        assert_int_equal(lease_log_add(f->log, &b), 0);
        assert_int_equal(lease_log_flush(f->log), 0);
        append_raw(f, "0badc0de {\"lease\":{\"id\":\"cc");
        HistoryState s = {};
        LeaseLogRead info;
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, 0);
        assert_int_equal(s.n_leases, 1);
        history_state_done(&s);
}

static void test_damaged_line_is_counted_and_skipped(void **state) {
        Fixture *f = *state;
        HistoryLeaseRow b = row_b("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", 3), c = row_b("cccccccccccccccccccccccccccccccc", 4);
        assert_int_equal(lease_log_add(f->log, &b), 0);
        assert_int_equal(lease_log_flush(f->log), 0);
        append_raw(f, "00000000 {\"end\":\"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\"}\n"); /* wrong CRC */
        assert_int_equal(lease_log_add(f->log, &c), 0);
        assert_int_equal(lease_log_flush(f->log), 0);
        HistoryState s = {};
        LeaseLogRead info;
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, 1);
        assert_int_equal(s.n_leases, 2); /* the end did not check out: b is still held */
        assert_int_equal(info.damage_size, strlen("00000000 {\"end\":\"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\"}\n"));
        assert_memory_equal(info.damage, "00000000 {\"end\":", 16); /* kept as it was, for an operator */
        history_state_done(&s);
        lease_log_read_done(&info);
}

static void append_checked(Fixture *f, const char *json);

/* What came before a "reset" line is written again after it, by a brokerd that read it: damage there hid
 * nothing. Damage after it did. */
static void test_damage_before_a_reset_does_not_count(void **state) {
        Fixture *f = *state;
        append_raw(f, "00000000 {\"lease\":{}}\n");
        append_checked(f, "{\"reset\":true}");
        HistoryState s = {};
        LeaseLogRead info = {};
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, 0);
        assert_int_equal(info.damage_size, 0);
        history_state_done(&s);
        lease_log_read_done(&info);

        append_raw(f, "12345678 not json\n");
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, 1);
        assert_int_equal(info.damage_size, strlen("12345678 not json\n"));
        assert_memory_equal(info.damage, "12345678 not json\n", info.damage_size);
        history_state_done(&s);
        lease_log_read_done(&info);
}

/* A write that failed and could not be cut off left half a line; a snapshot appended in place (the directory
 * takes no new file) must not be glued to it: its "reset" would then not read, and what came before would
 * count again. */
static void test_snapshot_in_place_after_a_half_line(void **state) {
        Fixture *f = *state;
        HistoryLeaseRow a = row_a(), b = row_b("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", 3);
        char blocker[160];

        assert_int_equal(lease_log_add(f->log, &b), 0);
        assert_int_equal(lease_log_flush(f->log), 0);
        append_raw(f, "0badc0de {\"lease\":{\"id\":\"cc");
        /* Where the new file would be made is taken: the snapshot goes in place, after a "reset". */
        snprintf(blocker, sizeof blocker, "%s/" LEASE_LOG_FILE ".new", f->dir);
        assert_int_equal(mkdir(blocker, 0700), 0);
        assert_int_equal(lease_log_rewrite(f->log, &a, 1, 1700000009000000), 0);
        assert_int_equal(rmdir(blocker), 0);
        assert_int_equal(lines_with(f, "\"reset\""), 1);

        HistoryState s = {};
        LeaseLogRead info = {};
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, 0);
        assert_int_equal(s.n_leases, 1); /* a alone: the reset dropped b */
        assert_string_equal(s.leases[0].id, a.id);
        history_state_done(&s);
        lease_log_read_done(&info);
}

static void test_not_a_lease_log(void **state) {
        Fixture *f = *state;
        int fd = open(f->path, O_WRONLY | O_TRUNC | O_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, "SQLite format 3\0garbage\n", 24), 24);
        close(fd);
        HistoryState s = {};
        LeaseLogRead info;
        assert_int_equal(lease_log_read(f->dir, &s, &info), -EBADMSG);
        char *moved = NULL;
        assert_int_equal(lease_log_move_aside(f->dir, &moved), 0);
        assert_non_null(strstr(moved, LEASE_LOG_FILE ".corrupt-"));
        assert_int_equal(access(moved, F_OK), 0);
        free(moved);
        assert_int_equal(lease_log_read(f->dir, &s, &info), 0);
        assert_false(info.exists);
        history_state_done(&s);
}

static void test_failed_write_leaves_no_half_line_and_a_snapshot_mends(void **state) {
        Fixture *f = *state;
        HistoryLeaseRow a = row_a(), b = row_b("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", 3);
        struct stat st;
        struct rlimit old, small;

        assert_int_equal(lease_log_add(f->log, &b), 0);
        assert_int_equal(lease_log_flush(f->log), 0);
        assert_int_equal(stat(f->path, &st), 0);

        /* The file may grow by 10 bytes: the write of a's line stops half-way, the next fails (EFBIG). */
        assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
        small = (struct rlimit) { .rlim_cur = (rlim_t) st.st_size + 10, .rlim_max = old.rlim_max };
        signal(SIGXFSZ, SIG_IGN);
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
        assert_int_equal(lease_log_add(f->log, &a), 0);
        assert_int_equal(lease_log_flush(f->log), -EFBIG);
        assert_true(lease_log_is_broken(f->log));
        /* Broken: lines are not taken until a snapshot. */
        assert_int_equal(lease_log_end(f->log, b.id), 0);
        assert_int_equal(lease_log_flush(f->log), -EIO);
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);

        struct stat after;
        assert_int_equal(stat(f->path, &after), 0);
        assert_int_equal(after.st_size, st.st_size);
        HistoryState s = {};
        LeaseLogRead info;
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, 0);
        assert_int_equal(s.n_leases, 1);
        history_state_done(&s);

        /* What is live now: a (granted best-effort, say), not b (ended while the log was broken). */
        assert_int_equal(lease_log_rewrite(f->log, &a, 1, 1700000009000000), 0);
        assert_false(lease_log_is_broken(f->log));
        read_back(f, &s, &info);
        assert_int_equal(s.n_leases, 1);
        assert_string_equal(s.leases[0].id, a.id);
        assert_int_equal(s.alive_at, 1700000009000000);
        assert_int_equal(floor_of(&s, "q")->next_token, 4);
        history_state_done(&s);
}

static void test_rewrite_when_the_log_outgrows_what_is_live(void **state) {
        Fixture *f = *state;
        char id[33];
        unsigned n = 0;
        while (!lease_log_wants_rewrite(f->log, 1)) {
                snprintf(id, sizeof id, "%032x", n);
                HistoryLeaseRow b = row_b(id, ++n);
                assert_int_equal(lease_log_add(f->log, &b), 0);
                assert_int_equal(lease_log_end(f->log, id), 0);
                assert_int_equal(lease_log_flush(f->log), 0);
                assert_true(n < 100000);
        }
        assert_true(n > 1000); /* not after a handful of lines */
        HistoryLeaseRow live = row_b("dddddddddddddddddddddddddddddddd", n + 1);
        assert_int_equal(lease_log_rewrite(f->log, &live, 1, 0), 0);
        assert_false(lease_log_wants_rewrite(f->log, 1));
        struct stat st;
        assert_int_equal(stat(f->path, &st), 0);
        assert_true(st.st_size < 1024);
        HistoryState s = {};
        LeaseLogRead info;
        read_back(f, &s, &info);
        assert_int_equal(s.n_leases, 1);
        assert_int_equal(floor_of(&s, "q")->next_token, n + 2);
        history_state_done(&s);
}

/* A shared pool's lease keeps the backend's name for it across a restart (and a rewrite); a local lease's
 * line has no such field, as before shared pools. */
static void test_remote_id_is_kept_for_shared_leases_only(void **state) {
        Fixture *f = *state;
        HistoryLeaseRow shared = row_b("eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", 11), local = row_a();
        shared.remote_id = "0123456789abcdef0123456789abcdef:42";
        assert_int_equal(lease_log_add(f->log, &shared), 0);
        assert_int_equal(lease_log_add(f->log, &local), 0);
        assert_int_equal(lease_log_flush(f->log), 0);

        for (int pass = 0; pass < 2; pass++) {
                HistoryState s = {};
                LeaseLogRead info;
                read_back(f, &s, &info);
                assert_int_equal(info.damaged, 0);
                assert_int_equal(s.n_leases, 2);
                assert_string_equal(lease_of(&s, shared.id)->remote_id, shared.remote_id);
                assert_null(lease_of(&s, local.id)->remote_id);
                history_state_done(&s);
                /* The snapshot writes the same lines. */
                HistoryLeaseRow live[] = { shared, local };
                assert_int_equal(lease_log_rewrite(f->log, live, 2, 0), 0);
        }

        assert_int_equal(lines_with(f, "\"remote\":"), 1);
}

/* Where a shared lease was granted goes with it (issue 19 f): a restart whose configuration no longer shares
 * the pool there heartbeats and releases it there. */
static void test_backend_of_a_shared_lease_is_kept(void **state) {
        Fixture *f = *state;
        HistoryLeaseRow shared = row_b("eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", 11);
        shared.remote_id = "0123456789abcdef0123456789abcdef:42";
        shared.backend = (HistoryLeaseBackend) {
                .url = "redis://10.0.0.1:6379/2", .password_file = "/etc/brokerd/redis.pass", .node_ttl = 20000000,
        };
        assert_int_equal(lease_log_add(f->log, &shared), 0);
        assert_int_equal(lease_log_flush(f->log), 0);
        for (int pass = 0; pass < 2; pass++) {
                HistoryState s = {};
                LeaseLogRead info;
                read_back(f, &s, &info);
                assert_int_equal(info.damaged, 0);
                const HistoryLeaseRow *r = lease_of(&s, shared.id);
                assert_string_equal(r->backend.url, "redis://10.0.0.1:6379/2");
                assert_null(r->backend.user);
                assert_string_equal(r->backend.password_file, "/etc/brokerd/redis.pass");
                assert_null(r->backend.sentinel_password_file);
                assert_int_equal(r->backend.node_ttl, 20000000);
                history_state_done(&s);
                HistoryLeaseRow live[] = { shared };
                assert_int_equal(lease_log_rewrite(f->log, live, 1, 0), 0);
        }
}

static void test_floor_for_every_pool(void **state) {
        Fixture *f = *state;
        HistoryState none = {};
        LeaseLog *log;
        assert_int_equal(lease_log_new(f->dir, &none, 1700000000000000, &log), 0);
        assert_int_equal(lease_log_rewrite(log, NULL, 0, 0), 0);
        HistoryState s = {};
        LeaseLogRead info;
        read_back(f, &s, &info);
        assert_int_equal(floor_of(&s, HISTORY_TOKEN_FLOOR_ALL)->next_token, 1700000000000000);
        history_state_done(&s);
        lease_log_free(log);
}

/* The leases of a long log: most lines drop a lease read before them (an end, the same lease written
 * again, a reset), which lease_log_read() finds by id. 24,800 lease lines; the live ones come out once
 * each, with their last line's token. */
#define MANY 20000
#define MANY_BEFORE_RESET 12000
#define ENDS_LAG 37

static bool many_is_live(unsigned i) {
        return i < MANY_BEFORE_RESET ? i % 3 == 1 : i % 3 != 0;
}

static uint64_t many_token(unsigned i) {
        return i + 1 + (i < MANY_BEFORE_RESET && i % 15 == 1 ? 100000 : 0);
}

static int cmp_row_id(const void *a, const void *b) {
        return strcmp(((const HistoryLeaseRow *) a)->id, ((const HistoryLeaseRow *) b)->id);
}

static void test_many_leases_ends_rewrites_and_a_reset(void **state) {
        Fixture *f = *state;
        static char ids[MANY][33];
        static HistoryLeaseRow snapshot[MANY_BEFORE_RESET];
        size_t n_snapshot = 0;
        char newdir[192];

        for (unsigned i = 0; i < MANY; i++) {
                /* Random-looking, as brokerd's are (consecutive ones would spread evenly over any hash). */
                uint64_t x = (i + 1) * 0x9e3779b97f4a7c15u;
                x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9u;
                snprintf(ids[i], sizeof ids[i], "%016" PRIx64 "%016x", x ^ (x >> 29), i);
                if (i == MANY_BEFORE_RESET) {
                        /* A snapshot that cannot be renamed over the log is appended after a "reset": it keeps
                         * i % 3 == 1 and drops i % 3 == 2, read before it. */
                        assert_int_equal(lease_log_flush(f->log), 0);
                        snprintf(newdir, sizeof newdir, "%s/" LEASE_LOG_FILE ".new", f->dir);
                        assert_int_equal(mkdir(newdir, 0700), 0);
                        assert_int_equal(lease_log_rewrite(f->log, snapshot, n_snapshot, 0), 0);
                        assert_int_equal(rmdir(newdir), 0);
                }
                HistoryLeaseRow b = row_b(ids[i], i + 1);
                assert_int_equal(lease_log_add(f->log, &b), 0);
                /* Ends come out of order: the lease that goes is seldom the last one read. */
                if (i >= ENDS_LAG && (i - ENDS_LAG) % 3 == 0)
                        assert_int_equal(lease_log_end(f->log, ids[i - ENDS_LAG]), 0);
                if (i < MANY_BEFORE_RESET && i % 3 == 1)
                        snapshot[n_snapshot++] = b;
                if (i % 100 == 99)
                        assert_int_equal(lease_log_flush(f->log), 0);
        }
        for (unsigned i = MANY - ENDS_LAG; i < MANY; i++)
                if (i % 3 == 0)
                        assert_int_equal(lease_log_end(f->log, ids[i]), 0);
        /* After the reset, some of the snapshot's leases written again with another token. */
        for (unsigned i = 1; i < MANY_BEFORE_RESET; i += 15) {
                HistoryLeaseRow b = row_b(ids[i], many_token(i));
                assert_int_equal(lease_log_add(f->log, &b), 0);
        }
        assert_int_equal(lease_log_flush(f->log), 0);

        assert_int_equal(lines_with(f, "{\"reset\":true}"), 1);

        HistoryState s = {};
        LeaseLogRead info;
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, 0);
        static HistoryLeaseRow expected[MANY];
        size_t n_expected = 0;
        for (unsigned i = 0; i < MANY; i++)
                if (many_is_live(i))
                        expected[n_expected++] = (HistoryLeaseRow) { .id = ids[i], .token = many_token(i) };
        qsort(expected, n_expected, sizeof expected[0], cmp_row_id);
        qsort(s.leases, s.n_leases, sizeof s.leases[0], cmp_row_id);
        assert_int_equal(s.n_leases, n_expected);
        for (size_t i = 0; i < n_expected; i++) {
                assert_string_equal(s.leases[i].id, expected[i].id);
                assert_int_equal(s.leases[i].token, expected[i].token);
        }
        assert_int_equal(floor_of(&s, "q")->next_token, many_token(1 + 15 * ((MANY_BEFORE_RESET - 2) / 15)) + 1);
        history_state_done(&s);
}

/* ---- rests (cooldown=) ---- */

/* A line with a CRC that checks out: what it says is judged, not its checksum. */
static void append_checked(Fixture *f, const char *json) {
        char line[512];
        snprintf(line, sizeof line, "%08" PRIx32 " %s\n", crc32_reference(json, strlen(json)), json);
        append_raw(f, line);
}

static const LeaseLogRest *rest_of(const LeaseLogRead *info, const char *pool, const char *member, unsigned slot) {
        for (size_t i = 0; i < info->n_rests; i++)
                if (streq(info->rests[i].pool, pool) && streq_ptr(info->rests[i].member, member) &&
                    (member || info->rests[i].slot == slot))
                        return &info->rests[i];
        return NULL;
}

/* A line with a good CRC is still untrusted: a number out of its range is damage (and the tokens go on above
 * the clock, manager.c), never cast into a token that goes back or wraps, a time before 1970, or root. */
static void test_numbers_out_of_range_are_damage(void **state) {
        Fixture *f = *state;
        static const char *const lines[] = {
                "{\"token\":{\"pool\":\"p\",\"next\":-2}}",
                "{\"token\":{\"pool\":\"p\",\"next\":9223372036854775807}}",
                "{\"alive\":-796496812566797}", /* read as unsigned: a mark from the far future (fuzz-lease-log) */
#define LEASE(fields) "{\"lease\":{\"id\":\"cccccccccccccccccccccccccccccccc\",\"pool\":\"p\",\"lane\":\"l\"," \
                      "\"slots\":[2]," fields ",\"detached\":true}}"
                LEASE("\"token\":-1,\"uid\":1000,\"pid\":5,\"grantedAt\":1"),
                LEASE("\"token\":0,\"uid\":1000,\"pid\":5,\"grantedAt\":1"),
                LEASE("\"token\":9223372036854775806,\"uid\":1000,\"pid\":5,\"grantedAt\":1"),
                LEASE("\"token\":7,\"pid\":5,\"grantedAt\":1"),                      /* no uid: not root */
                LEASE("\"token\":7,\"uid\":-1,\"pid\":5,\"grantedAt\":1"),
                LEASE("\"token\":7,\"uid\":1000,\"grantedAt\":1"),                    /* no pid */
                LEASE("\"token\":7,\"uid\":1000,\"pid\":5,\"grantedAt\":-1"),
                LEASE("\"token\":7,\"uid\":1000,\"pid\":5,\"grantedAt\":1,\"expiresAt\":-5"),
                LEASE("\"token\":7,\"uid\":1000,\"pid\":-5,\"grantedAt\":1"),
                LEASE("\"token\":7,\"uid\":1000,\"pid\":5,\"commandPid\":-1,\"commandStart\":1,\"grantedAt\":1"),
                /* Quarantine rules: statuses 1 to 255, at least one, and 1 to 1000 in a row. */
                LEASE("\"token\":7,\"uid\":1000,\"pid\":5,\"grantedAt\":1,\"quarantine\":{\"exitCodes\":[0],\"after\":1}"),
                LEASE("\"token\":7,\"uid\":1000,\"pid\":5,\"grantedAt\":1,\"quarantine\":{\"exitCodes\":[256],\"after\":1}"),
                LEASE("\"token\":7,\"uid\":1000,\"pid\":5,\"grantedAt\":1,\"quarantine\":{\"exitCodes\":[],\"after\":1}"),
                LEASE("\"token\":7,\"uid\":1000,\"pid\":5,\"grantedAt\":1,\"quarantine\":{\"exitCodes\":[3],\"after\":0}"),
                LEASE("\"token\":7,\"uid\":1000,\"pid\":5,\"grantedAt\":1,\"quarantine\":{\"exitCodes\":[3],\"after\":1001}"),
                LEASE("\"token\":7,\"uid\":1000,\"pid\":5,\"grantedAt\":1,\"quarantine\":{\"exitCodes\":[3]}"),
                LEASE("\"token\":7,\"uid\":1000,\"pid\":5,\"grantedAt\":1,\"quarantine\":[3]"),
#undef LEASE
        };
        for (size_t i = 0; i < ELEMENTSOF(lines); i++)
                append_checked(f, lines[i]);
        HistoryState s = {};
        LeaseLogRead info = {};
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, ELEMENTSOF(lines));
        assert_int_equal(s.n_leases, 0);
        assert_null(floor_of(&s, "p"));
        assert_int_equal(s.alive_at, 0);
        history_state_done(&s);
        lease_log_read_done(&info);

        /* The same lease in range is one. */
        append_checked(f, "{\"lease\":{\"id\":\"cccccccccccccccccccccccccccccccc\",\"pool\":\"p\",\"lane\":\"l\","
                          "\"slots\":[2],\"token\":7,\"uid\":1000,\"pid\":5,\"grantedAt\":1,\"detached\":true}}");
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, ELEMENTSOF(lines));
        assert_int_equal(s.n_leases, 1);
        assert_int_equal(s.leases[0].token, 7);
        history_state_done(&s);
        lease_log_read_done(&info);
}

static void test_rests_are_read_back_replaced_and_reset(void **state) {
        Fixture *f = *state;
        assert_int_equal(lease_log_rest(f->log, "rigs", 1, "rig-b", 1700000100000000), 0);
        assert_int_equal(lease_log_rest(f->log, "lic", 3, NULL, 1700000050000000), 0);
        assert_int_equal(lease_log_rest(f->log, "rigs", 0, "rig-b", 1700000200000000), 0); /* moved, rests again */
        assert_int_equal(lease_log_flush(f->log), 0);
        HistoryState s = {};
        LeaseLogRead info = {};
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, 0);
        assert_int_equal(info.n_rests, 2);
        assert_int_equal(rest_of(&info, "rigs", "rig-b", 0)->until, 1700000200000000);
        assert_int_equal(rest_of(&info, "rigs", "rig-b", 0)->slot, 0);
        assert_int_equal(rest_of(&info, "lic", NULL, 3)->until, 1700000050000000);
        history_state_done(&s);
        lease_log_read_done(&info);

        /* Untrusted: each of these is damage, never a rest. */
        append_checked(f, "{\"rest\":{\"pool\":\"lic\",\"slot\":-1,\"until\":5}}");
        append_checked(f, "{\"rest\":{\"pool\":\"lic\",\"slot\":1000000,\"until\":5}}");
        append_checked(f, "{\"rest\":{\"pool\":\"bad name\",\"slot\":1,\"until\":5}}");
        append_checked(f, "{\"rest\":{\"pool\":\"lic\",\"slot\":1,\"until\":0}}");
        append_checked(f, "{\"rest\":{\"pool\":\"lic\",\"slot\":1,\"member\":7,\"until\":5}}");
        append_checked(f, "{\"rest\":{\"pool\":\"lic\",\"slot\":1,\"until\":5,\"extra\":1}}");
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, 6);
        assert_int_equal(info.n_rests, 2);
        history_state_done(&s);
        lease_log_read_done(&info);

        /* A snapshot keeps the rests that end after its alive mark, and a "reset" drops what came before. */
        assert_int_equal(lease_log_rewrite(f->log, NULL, 0, 1700000100000000), 0);
        assert_int_equal(lines_with(f, "\"rest\""), 1);
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, 0);
        assert_int_equal(info.n_rests, 1);
        assert_non_null(rest_of(&info, "rigs", "rig-b", 0));
        history_state_done(&s);
        lease_log_read_done(&info);
        append_checked(f, "{\"reset\":true}");
        read_back(f, &s, &info);
        assert_int_equal(info.n_rests, 0);
        history_state_done(&s);
        lease_log_read_done(&info);
}

/* ---- members' counts (SPEC §3.6, usage per member; issue 23 "everything persists") ---- */

static const LeaseLogUse *use_of(const LeaseLogRead *info, const char *pool, const char *member) {
        for (size_t i = 0; i < info->n_uses; i++)
                if (streq(info->uses[i].pool, pool) && streq(info->uses[i].member, member))
                        return &info->uses[i];
        return NULL;
}

static void test_member_counts_are_read_back_replaced_kept_by_snapshots_and_reset(void **state) {
        Fixture *f = *state;
        assert_int_equal(lease_log_use(f->log, &(LeaseLogUse) { .pool = "rigs", .member = "rig-a", .grants = 1 }), 0);
        assert_int_equal(lease_log_use(f->log, &(LeaseLogUse) { .pool = "rigs", .member = "rig-b", .grants = 7,
                                                                .held = 123456789, .quarantines = 2, .failures = 1 }),
                         0);
        assert_int_equal(lease_log_use(f->log, &(LeaseLogUse) { .pool = "rigs", .member = "rig-a", .grants = 2,
                                                                .held = 5000000, .failures = 3 }),
                         0); /* the later line wins */
        assert_int_equal(lease_log_flush(f->log), 0);
        HistoryState s = {};
        LeaseLogRead info = {};
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, 0);
        assert_int_equal(info.n_uses, 2);
        const LeaseLogUse *a = use_of(&info, "rigs", "rig-a"), *b = use_of(&info, "rigs", "rig-b");
        assert_int_equal(a->grants, 2);
        assert_int_equal(a->held, 5000000);
        assert_int_equal(a->quarantines, 0);
        assert_int_equal(a->failures, 3);
        assert_int_equal(b->grants, 7);
        assert_int_equal(b->held, 123456789);
        assert_int_equal(b->quarantines, 2);
        assert_int_equal(b->failures, 1);
        history_state_done(&s);
        lease_log_read_done(&info);

        /* Untrusted: each of these is damage, never counts. */
        append_checked(f, "{\"use\":{\"pool\":\"rigs\",\"member\":\"rig-a\",\"grants\":-1,\"heldUs\":0,\"quarantines\":0,\"failures\":0}}");
        append_checked(f, "{\"use\":{\"pool\":\"rigs\",\"member\":\"../x\",\"grants\":1,\"heldUs\":0,\"quarantines\":0,\"failures\":0}}");
        append_checked(f, "{\"use\":{\"pool\":\"rigs\",\"grants\":1,\"heldUs\":0,\"quarantines\":0,\"failures\":0}}");
        append_checked(f, "{\"use\":{\"pool\":\"rigs\",\"member\":\"rig-a\",\"grants\":1,\"heldUs\":0,\"quarantines\":0,\"failures\":5000000000}}");
        append_checked(f, "{\"use\":{\"pool\":\"rigs\",\"member\":\"rig-a\",\"grants\":1,\"heldUs\":\"1\",\"quarantines\":0,\"failures\":0}}");
        append_checked(f, "{\"use\":{\"pool\":\"rigs\",\"member\":\"rig-a\",\"grants\":1,\"heldUs\":0,\"quarantines\":0,\"failures\":0,\"x\":1}}");
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, 6);
        assert_int_equal(use_of(&info, "rigs", "rig-a")->grants, 2);
        history_state_done(&s);
        lease_log_read_done(&info);

        /* A snapshot keeps every member's counts (a reload may bring a member back), and they are no growth that
         * asks for another rewrite; a "reset" drops what came before. */
        assert_int_equal(lease_log_rewrite(f->log, NULL, 0, 1700000100000000), 0);
        assert_int_equal(lines_with(f, "\"use\""), 2);
        assert_false(lease_log_wants_rewrite(f->log, 0));
        read_back(f, &s, &info);
        assert_int_equal(info.damaged, 0);
        assert_int_equal(info.n_uses, 2);
        assert_int_equal(use_of(&info, "rigs", "rig-b")->held, 123456789);
        history_state_done(&s);
        lease_log_read_done(&info);
        append_checked(f, "{\"reset\":true}");
        read_back(f, &s, &info);
        assert_int_equal(info.n_uses, 0);
        history_state_done(&s);
        lease_log_read_done(&info);
}

static bool only_lic(const char *pool, unsigned slot, const char *member, void *userdata) {
        return streq(pool, "lic");
}

static void test_rests_a_reload_ended_stay_ended(void **state) {
        Fixture *f = *state;
        assert_int_equal(lease_log_rest(f->log, "rigs", 1, "rig-b", 1700000100000000), 0);
        assert_int_equal(lease_log_rest(f->log, "lic", 3, NULL, 1700000100000000), 0);
        assert_int_equal(lease_log_rest(f->log, "old", 0, NULL, 1700000000000000), 0); /* over already */
        assert_int_equal(lease_log_rests_end(f->log, only_lic, NULL, 1700000050000000), 0);
        assert_int_equal(lease_log_flush(f->log), 0);
        assert_int_equal(lines_with(f, "\"rest\""), 4); /* only rig-b's rest got an end line */
        HistoryState s = {};
        LeaseLogRead info = {};
        read_back(f, &s, &info);
        assert_int_equal(rest_of(&info, "rigs", "rig-b", 1)->until, 1700000050000000);
        assert_int_equal(rest_of(&info, "lic", NULL, 3)->until, 1700000100000000);
        history_state_done(&s);
        lease_log_read_done(&info);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_what_is_written_is_read, setup, teardown),
                cmocka_unit_test_setup_teardown(test_a_grant_after_the_last_mark_counts_as_one, setup, teardown),
                cmocka_unit_test_setup_teardown(test_token_marks_outlive_their_leases, setup, teardown),
                cmocka_unit_test_setup_teardown(test_torn_last_line_is_not_damage, setup, teardown),
                cmocka_unit_test_setup_teardown(test_damaged_line_is_counted_and_skipped, setup, teardown),
                cmocka_unit_test_setup_teardown(test_damage_before_a_reset_does_not_count, setup, teardown),
                cmocka_unit_test_setup_teardown(test_snapshot_in_place_after_a_half_line, setup, teardown),
                cmocka_unit_test_setup_teardown(test_numbers_out_of_range_are_damage, setup, teardown),
                cmocka_unit_test_setup_teardown(test_not_a_lease_log, setup, teardown),
                cmocka_unit_test_setup_teardown(test_failed_write_leaves_no_half_line_and_a_snapshot_mends, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_rewrite_when_the_log_outgrows_what_is_live, setup, teardown),
                cmocka_unit_test_setup_teardown(test_floor_for_every_pool, setup, teardown),
                cmocka_unit_test_setup_teardown(test_remote_id_is_kept_for_shared_leases_only, setup, teardown),
                cmocka_unit_test_setup_teardown(test_backend_of_a_shared_lease_is_kept, setup, teardown),
                cmocka_unit_test_setup_teardown(test_also_pools_of_a_lease_are_read_back, setup, teardown),
                cmocka_unit_test_setup_teardown(test_many_leases_ends_rewrites_and_a_reset, setup, teardown),
                cmocka_unit_test_setup_teardown(test_rests_are_read_back_replaced_and_reset, setup, teardown),
                cmocka_unit_test_setup_teardown(test_rests_a_reload_ended_stay_ended, setup, teardown),
                cmocka_unit_test_setup_teardown(test_member_counts_are_read_back_replaced_kept_by_snapshots_and_reset,
                                                setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
