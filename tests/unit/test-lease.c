/* SPDX-License-Identifier: MIT */
/* test-lease.c — the lease state machine alone (lease.h): no session, no lease log (rows are not written:
 * PERSISTED says LEASE_NOT_PERSISTED), no audit, a fake clock and an injected random source, a real
 * engine for the slots, and a real sd-event loop for what a lease waits on (its command's pidfd, the
 * revoke grace). What it does on its own comes out as events, drained as the manager does. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "config-files.h"
#include "engine.h"
#include "history.h"
#include "lease.h"
#include "process.h"

/* Every calloc() of the code linked in fails while set (meson links this test with --wrap=calloc): a full
 * memory, where a lease's events must not be lost. */
static bool calloc_fails;
void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size) {
        return calloc_fails ? NULL : __real_calloc(n, size);
}

static usec_t fake_mono = 1000 * USEC_PER_SEC, fake_real = 1700000000 * USEC_PER_SEC;

static usec_t fake_now(clockid_t clock) {
        return clock == CLOCK_REALTIME ? fake_real : fake_mono;
}

static void counting_bytes(void *buf, size_t n, void *userdata) {
        uint8_t *counter = userdata;
        for (size_t i = 0; i < n; i++)
                ((uint8_t *) buf)[i] = (*counter)++;
}

static uint64_t engine_random(void *userdata) {
        return 4; /* chosen by a fair dice roll */
}

typedef struct Fixture {
        sd_event *event;
        Engine *engine;
        BrokerConfig *config;
        LeaseTable t;
        uint8_t counter;
        pid_t child;
} Fixture;

static int setup(void **state) {
        calloc_fails = false; /* a failed test's longjmp skipped its reset */
        Fixture *f = calloc(1, sizeof(Fixture));
        ConfErrors errors = {};
        assert_non_null(f);
        assert_int_equal(config_load_string("[pool p]\nlimit = 2\n\n[lane l]\npools = p\npolicy = wait\n", "test",
                                            &f->config, &errors),
                         0);
        assert_int_equal(sd_event_new(&f->event), 0);
        assert_int_equal(engine_new(engine_random, NULL, &f->engine), 0);
        assert_int_equal(engine_configure(f->engine, f->config, fake_mono), 0);
        lease_table_init(&f->t, f->event, f->engine, NULL);
        f->t.now = fake_now;
        f->t.random_bytes = counting_bytes;
        f->t.random_userdata = &f->counter;
        f->t.revoke_grace = 1000; /* 1 ms of the real clock: sd-event's timers */
        f->t.reclaim_grace = USEC_PER_SEC;
        f->child = -1;
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        lease_table_done(&f->t);
        if (f->child > 0) {
                (void) kill(f->child, SIGKILL);
                (void) waitpid(f->child, NULL, 0);
        }
        engine_free(f->engine);
        conf_free(f->config);
        sd_event_unref(f->event);
        free(f);
        return 0;
}

static unsigned in_use(Fixture *f) {
        EnginePoolInfo info;
        assert_int_equal(engine_pool_info(f->engine, 0, fake_mono, &info), 0);
        return info.in_use;
}

/* A fresh grant from the engine, made a lease. command: a child to attach, or none (NULL: pidfds are not
 * available here). */
static Lease *grant(Fixture *f, void *holder, bool detached, bool command) {
        EngineRequest *req;
        EngineEvent ev;
        assert_int_equal(engine_acquire(f->engine, &(EngineAcquire) { .lane = "l", .slots = 1, .max_wait = USEC_INFINITY },
                                        fake_mono, &req),
                         0);
        engine_run(f->engine, fake_mono);
        assert_true(engine_pop_event(f->engine, &ev));
        assert_int_equal(ev.type, ENGINE_EVENT_GRANTED);
        engine_request_unref(req);

        ProcessInfo info = {};
        int pidfd = -EBADF;
        if (command) {
                f->child = fork();
                assert_true(f->child >= 0);
                if (f->child == 0) {
                        pause();
                        _exit(0);
                }
                pidfd = process_open(f->child, &info);
                if (pidfd == -ENOSYS) {
                        engine_lease_release(ev.lease, fake_mono);
                        return NULL; /* no pidfd_open() here (valgrind 3.19 has none): the caller skips */
                }
                assert_true(pidfd >= 0);
        }
        Lease *l;
        assert_int_equal(lease_new(&f->t, ev.lease, holder, 1000, 42, "job", detached, command ? &info : NULL, pidfd, &l),
                         0);
        return l;
}

static void pump(Fixture *f) {
        assert_true(sd_event_run(f->event, 10 * 1000) >= 0);
}

static void test_ids_come_from_the_injected_random_source(void **state) {
        Fixture *f = *state;
        Lease *l = grant(f, NULL, true, false);
        assert_string_equal(l->id, "000102030405060708090a0b0c0d0e0f");
        assert_ptr_equal(lease_table_find(&f->t, "000102030405060708090a0b0c0d0e0f"), l);
        assert_int_equal(f->t.n_leases, 1);
}

static void test_times_come_from_the_fake_clock(void **state) {
        Fixture *f = *state;
        Lease *l = grant(f, NULL, true, false);
        fake_mono += 5 * USEC_PER_SEC;
        fake_real += 5 * USEC_PER_SEC;
        json_t *j = lease_to_json(l);
        assert_non_null(j);
        assert_int_equal(json_integer_value(json_object_get(j, "grantedAt")), fake_real - 5 * USEC_PER_SEC);
        json_decref(j);
}

static void test_grant_without_a_log_reports_not_persisted(void **state) {
        Fixture *f = *state;
        int waiter;
        LeaseEvent ev;
        Lease *l = grant(f, &waiter, false, false);
        assert_false(lease_table_pop_event(&f->t, &ev));
        lease_persist(l, &waiter);
        assert_true(lease_table_pop_event(&f->t, &ev));
        assert_int_equal(ev.type, LEASE_EVENT_PERSISTED);
        assert_ptr_equal(ev.lease, l);
        assert_ptr_equal(ev.waiter, &waiter);
        assert_int_equal(ev.result, LEASE_NOT_PERSISTED);
        assert_false(lease_table_pop_event(&f->t, &ev));

        lease_persist(l, NULL); /* again, for nobody: its holder went before its grant was written */
        assert_true(lease_table_pop_event(&f->t, &ev));
        assert_ptr_equal(ev.lease, l);
        assert_null(ev.waiter);
}

static void test_events_of_a_freed_lease_are_dropped(void **state) {
        Fixture *f = *state;
        int waiter;
        LeaseEvent ev;
        Lease *l = grant(f, &waiter, false, false);
        lease_persist(l, &waiter);
        lease_clear_holder(l);
        lease_discard(l); /* the grant withdrawn: slots back, no release recorded */
        assert_false(lease_table_pop_event(&f->t, &ev));
        assert_int_equal(in_use(f), 0);
        assert_int_equal(f->t.n_leases, 0);
}

/* A lease's PERSISTED and CUT need no memory when they come (lease_new() made room for them): a lost
 * PERSISTED would leave the lease of a holder that went held until max-hold. */
static void test_events_are_not_lost_to_a_full_memory(void **state) {
        Fixture *f = *state;
        int holder_a, holder_b;
        LeaseEvent ev;
        Lease *a = grant(f, &holder_a, false, false), *b = grant(f, &holder_b, false, false);
        assert_int_equal(lease_revoke(a, "max-hold"), LEASE_OUTCOME_REVOKED);
        assert_int_equal(lease_revoke(b, "max-hold"), LEASE_OUTCOME_REVOKED);

        calloc_fails = true;
        lease_persist(a, &holder_a);
        lease_persist(b, &holder_b);
        lease_start_revoke_grace(a);
        lease_start_revoke_grace(b);
        unsigned persisted = 0, cut = 0;
        for (int i = 0; cut < 2; i++) {
                assert_true(i < 1000);
                if (!lease_table_pop_event(&f->t, &ev)) {
                        pump(f);
                        continue;
                }
                assert_true(ev.lease == a || ev.lease == b);
                if (ev.type == LEASE_EVENT_PERSISTED) {
                        assert_ptr_equal(ev.waiter, ev.lease == a ? (void *) &holder_a : (void *) &holder_b);
                        persisted++;
                } else {
                        assert_int_equal(ev.type, LEASE_EVENT_CUT);
                        cut++;
                }
        }
        calloc_fails = false;
        assert_int_equal(persisted, 2);
        assert_false(lease_table_pop_event(&f->t, &ev));
}

static void test_holder_gone_ends_lease_without_command(void **state) {
        Fixture *f = *state;
        int holder;
        Lease *l = grant(f, &holder, false, false);
        assert_int_equal(in_use(f), 1);
        f->t.changed = false;
        lease_clear_holder(l);
        assert_int_equal(lease_holder_gone(l), LEASE_OUTCOME_ENDED);
        assert_int_equal(in_use(f), 0);
        assert_int_equal(f->t.n_leases, 0);
        assert_true(f->t.changed);
}

static void test_detached_lease_outlives_its_holder(void **state) {
        Fixture *f = *state;
        int holder;
        Lease *l = grant(f, &holder, true, false);
        assert_null(lease_get_holder(l)); /* detached: no life line */
        assert_int_equal(lease_holder_gone(l), LEASE_OUTCOME_HELD);
        assert_int_equal(f->t.n_leases, 1);
}

static void test_revoked_holder_is_cut_after_the_grace_not_before(void **state) {
        Fixture *f = *state;
        int holder;
        LeaseEvent ev;
        Lease *l = grant(f, &holder, false, false);
        assert_int_equal(lease_revoke(l, "max-hold"), LEASE_OUTCOME_REVOKED);
        assert_int_equal(l->state, LEASE_REVOKED);
        assert_int_equal(lease_revoke(l, "again"), LEASE_OUTCOME_HELD); /* revoked once */
        lease_start_revoke_grace(l);
        assert_false(lease_table_pop_event(&f->t, &ev)); /* not before the grace */
        for (int i = 0; !lease_table_pop_event(&f->t, &ev); i++) {
                assert_true(i < 1000);
                pump(f);
        }
        assert_int_equal(ev.type, LEASE_EVENT_CUT);
        assert_ptr_equal(ev.lease, l);
        assert_int_equal(in_use(f), 1); /* cutting is the owner's: the lease still holds */
}

static void test_revoked_lease_without_holder_or_command_ends(void **state) {
        Fixture *f = *state;
        Lease *l = grant(f, NULL, false, false);
        assert_int_equal(lease_revoke(l, "max-hold"), LEASE_OUTCOME_ENDED);
        assert_int_equal(in_use(f), 0);
        assert_int_equal(f->t.n_leases, 0);
}

static void test_revoked_lease_with_command_is_overdue_until_it_exits(void **state) {
        Fixture *f = *state;
        Lease *l = grant(f, NULL, false, true);
        if (!l)
                skip();
        assert_true(lease_command_running(l));
        assert_int_equal(lease_revoke(l, "max-hold"), LEASE_OUTCOME_OVERDUE);
        assert_int_equal(l->state, LEASE_OVERDUE);
        for (int i = 0; i < 3; i++)
                pump(f);
        assert_int_equal(f->t.n_leases, 1); /* the command still runs */

        assert_int_equal(kill(f->child, SIGKILL), 0);
        for (int i = 0; f->t.n_leases > 0; i++) {
                assert_true(i < 1000);
                pump(f); /* the pidfd's wakeup */
        }
        assert_int_equal(in_use(f), 0);
}

static void test_holder_gone_keeps_lease_while_its_command_runs(void **state) {
        Fixture *f = *state;
        int holder;
        Lease *l = grant(f, &holder, false, true);
        if (!l)
                skip();
        assert_null(l->command_source); /* held: read when asked, not watched */
        lease_clear_holder(l);
        assert_non_null(l->command_source);
        assert_int_equal(lease_holder_gone(l), LEASE_OUTCOME_HELD);
        assert_int_equal(f->t.n_leases, 1);
        assert_int_equal(kill(f->child, SIGKILL), 0);
        for (int i = 0; f->t.n_leases > 0; i++) {
                assert_true(i < 1000);
                pump(f);
        }
        assert_int_equal(in_use(f), 0);
}

/* While a holder holds the lease, its command's exit is no event (slotctl's Release follows it): it is read
 * when asked, and the lease ends as its holder goes. */
static void test_command_that_ended_under_a_holder_is_read_when_asked(void **state) {
        Fixture *f = *state;
        int holder;
        Lease *l = grant(f, &holder, false, true);
        if (!l)
                skip();
        assert_int_equal(kill(f->child, SIGKILL), 0);
        assert_int_equal(waitpid(f->child, NULL, 0), f->child);
        f->child = -1;
        assert_true(lease_command_running(l)); /* as of the last event: none came */
        lease_command_refresh(l);
        assert_false(lease_command_running(l));
        assert_int_equal(f->t.n_leases, 1); /* the holder still holds it */
        lease_clear_holder(l);
        assert_null(l->command_source); /* nothing left to watch */
        assert_int_equal(lease_holder_gone(l), LEASE_OUTCOME_ENDED);
        assert_int_equal(in_use(f), 0);
}

/* A command nobody watches (its watch could not be added when the holder went) is polled by the tick. */
static void test_command_not_watched_is_polled(void **state) {
        Fixture *f = *state;
        int holder;
        Lease *l = grant(f, &holder, false, true);
        if (!l)
                skip();
        l->holder = NULL; /* gone without lease_clear_holder(): as after a failed sd_event_add_io() */
        lease_table_poll_commands(&f->t);
        assert_int_equal(f->t.n_leases, 1);
        assert_int_equal(kill(f->child, SIGKILL), 0);
        assert_int_equal(waitpid(f->child, NULL, 0), f->child);
        f->child = -1;
        lease_table_poll_commands(&f->t);
        assert_int_equal(f->t.n_leases, 0);
        assert_int_equal(in_use(f), 0);
}

/* A command in a process group of its own, as slotctl starts it; ignore_term: it ignores SIGTERM. */
static Lease *grant_group_leader(Fixture *f, void *holder, bool ignore_term) {
        EngineRequest *req;
        EngineEvent ev;
        assert_int_equal(engine_acquire(f->engine, &(EngineAcquire) { .lane = "l", .slots = 1, .max_wait = USEC_INFINITY },
                                        fake_mono, &req),
                         0);
        engine_run(f->engine, fake_mono);
        assert_true(engine_pop_event(f->engine, &ev));
        engine_request_unref(req);
        f->child = fork();
        assert_true(f->child >= 0);
        if (f->child == 0) {
                (void) setpgid(0, 0);
                if (ignore_term)
                        (void) signal(SIGTERM, SIG_IGN);
                for (;;)
                        pause();
        }
        (void) setpgid(f->child, f->child); /* either side may run first */
        ProcessInfo info;
        int pidfd = process_open(f->child, &info);
        for (int i = 0; pidfd >= 0 && ignore_term && i < 1000; i++) { /* until the child has its handler */
                char path[64], buf[4096];
                snprintf(path, sizeof path, "/proc/%d/status", (int) f->child);
                FILE *s = fopen(path, "re");
                assert_non_null(s);
                size_t n = fread(buf, 1, sizeof buf - 1, s);
                fclose(s);
                buf[n] = 0;
                const char *ign = strstr(buf, "SigIgn:");
                if (ign && (strtoull(ign + 7, NULL, 16) & (1ULL << (SIGTERM - 1))))
                        break;
                usleep(1000);
        }
        if (pidfd == -ENOSYS) {
                engine_lease_release(ev.lease, fake_mono);
                return NULL;
        }
        assert_true(pidfd >= 0);
        info.pgid = f->child;
        Lease *l;
        assert_int_equal(lease_new(&f->t, ev.lease, holder, getuid(), 42, "job", false, &info, pidfd, &l), 0);
        return l;
}

/* Runs the loop (reaping the child, whose zombie would keep its group) until the lease is gone; returns how
 * the child ended. */
static int pump_until_gone(Fixture *f) {
        int status = -1;
        for (int i = 0; f->t.n_leases > 0; i++) {
                assert_true(i < 1000);
                pump(f);
                if (f->child > 0 && waitpid(f->child, &status, WNOHANG) == f->child)
                        f->child = -1;
        }
        return status;
}

static void test_lost_lease_nobody_holds_brokerd_stops_its_command(void **state) {
        Fixture *f = *state;
        Lease *l = grant_group_leader(f, NULL, false);
        if (!l)
                skip();
        /* Issue 19 d: slotctl is gone, its pool lost the lease: brokerd stops the command (SIGTERM). */
        assert_int_equal(lease_lose(l, "fenced"), LEASE_OUTCOME_OVERDUE);
        assert_int_equal(l->state, LEASE_REVOKED);
        int status = pump_until_gone(f);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
        assert_int_equal(in_use(f), 0);
}

static void test_lost_lease_command_that_ignores_sigterm_is_killed(void **state) {
        Fixture *f = *state;
        Lease *l = grant_group_leader(f, NULL, true);
        if (!l)
                skip();
        assert_int_equal(lease_lose(l, "fenced"), LEASE_OUTCOME_OVERDUE);
        int status = pump_until_gone(f); /* SIGKILL after revoke-grace (1 ms here) */
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

static void test_lost_after_max_hold_overdue_is_fenced_too(void **state) {
        Fixture *f = *state;
        Lease *l = grant_group_leader(f, NULL, false);
        if (!l)
                skip();
        /* A local revocation leaves it overdue (SPEC §3.4); its pool's loss then makes it brokerd's. */
        assert_int_equal(lease_revoke(l, "max-hold"), LEASE_OUTCOME_OVERDUE);
        assert_int_equal(l->state, LEASE_OVERDUE);
        pump(f);
        assert_int_equal(f->t.n_leases, 1);
        assert_int_equal(lease_lose(l, "fenced"), LEASE_OUTCOME_OVERDUE);
        assert_int_equal(l->state, LEASE_REVOKED);
        int status = pump_until_gone(f);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
}

static void test_lost_lease_holder_gets_the_grace_then_sigkill(void **state) {
        Fixture *f = *state;
        int holder;
        Lease *l = grant_group_leader(f, &holder, false);
        if (!l)
                skip();
        /* Its holder is told (REVOKED) and given revoke-grace; brokerd sends no SIGTERM of its own. */
        assert_int_equal(lease_lose(l, "fenced"), LEASE_OUTCOME_REVOKED);
        lease_start_revoke_grace(l);
        assert_false(l->fence_termed);
        lease_clear_holder(l);
        (void) lease_holder_gone(l); /* slotctl died meanwhile: SIGTERM now */
        int status = pump_until_gone(f);
        assert_true(WIFSIGNALED(status));
}

static void test_a_group_nothing_pins_is_not_signalled(void **state) {
        pid_t child = fork();
        assert_true(child >= 0);
        if (child == 0) {
                (void) setpgid(0, 0);
                _exit(0);
        }
        (void) setpgid(child, child);
        ProcessInfo info = { .pid = child, .pgid = child, .uid = getuid(), .start_time = 1 };
        assert_int_equal(waitpid(child, NULL, 0), child);
        /* Reaped: its id may be anyone's by now. */
        assert_int_equal(process_command_signal(-EBADF, &info, SIGTERM), -ESRCH);
}

static void test_reclaim_takes_an_unheld_lease_only(void **state) {
        Fixture *f = *state;
        int a, b;
        Lease *l = grant(f, &a, false, false);
        assert_int_equal(lease_reclaim(l, &b), -EBUSY); /* held */
        lease_clear_holder(l);
        assert_int_equal(lease_reclaim(l, &b), 0);
        assert_ptr_equal(lease_get_holder(l), &b);
}

/* The tests that attach a command need pidfd_open(), which valgrind (3.19) does not have: they run as
 * "test-lease pidfd", which meson keeps out of the valgrind run (suite no-valgrind). */
int main(int argc, char *argv[]) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_ids_come_from_the_injected_random_source, setup, teardown),
                cmocka_unit_test_setup_teardown(test_times_come_from_the_fake_clock, setup, teardown),
                cmocka_unit_test_setup_teardown(test_grant_without_a_log_reports_not_persisted, setup, teardown),
                cmocka_unit_test_setup_teardown(test_events_of_a_freed_lease_are_dropped, setup, teardown),
                cmocka_unit_test_setup_teardown(test_events_are_not_lost_to_a_full_memory, setup, teardown),
                cmocka_unit_test_setup_teardown(test_holder_gone_ends_lease_without_command, setup, teardown),
                cmocka_unit_test_setup_teardown(test_detached_lease_outlives_its_holder, setup, teardown),
                cmocka_unit_test_setup_teardown(test_revoked_holder_is_cut_after_the_grace_not_before, setup, teardown),
                cmocka_unit_test_setup_teardown(test_revoked_lease_without_holder_or_command_ends, setup, teardown),
                cmocka_unit_test_setup_teardown(test_reclaim_takes_an_unheld_lease_only, setup, teardown),
        };
        const struct CMUnitTest pidfd_tests[] = {
                cmocka_unit_test_setup_teardown(test_revoked_lease_with_command_is_overdue_until_it_exits, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_holder_gone_keeps_lease_while_its_command_runs, setup, teardown),
                cmocka_unit_test_setup_teardown(test_command_that_ended_under_a_holder_is_read_when_asked, setup,
                                                teardown),
                cmocka_unit_test_setup_teardown(test_command_not_watched_is_polled, setup, teardown),
                cmocka_unit_test_setup_teardown(test_lost_lease_nobody_holds_brokerd_stops_its_command, setup, teardown),
                cmocka_unit_test_setup_teardown(test_lost_lease_command_that_ignores_sigterm_is_killed, setup, teardown),
                cmocka_unit_test_setup_teardown(test_lost_after_max_hold_overdue_is_fenced_too, setup, teardown),
                cmocka_unit_test_setup_teardown(test_lost_lease_holder_gets_the_grace_then_sigkill, setup, teardown),
                cmocka_unit_test(test_a_group_nothing_pins_is_not_signalled),
        };
        if (argc > 1 && strcmp(argv[1], "pidfd") == 0)
                return cmocka_run_group_tests(pidfd_tests, NULL, NULL);
        return cmocka_run_group_tests(tests, NULL, NULL);
}
