/* SPDX-License-Identifier: MIT */
/* test-conf.c — the configuration model: every key and its default, every validation rule, error texts
 * that name file:line and key, empty-value resets, and dump → reparse round trips. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conf.h"

static BrokerConfig *c;
static ConfErrors errors;
static unsigned next_line;

static int setup(void **state) {
        next_line = 1;
        errors = (ConfErrors) {};
        return conf_new(&c);
}

static int teardown(void **state) {
        c = conf_free(c);
        conf_errors_done(&errors);
        return 0;
}

/* Sets a key as if it came from line `line` of test.conf. */
static int set_at(unsigned line, const char *section, const char *key, const char *value) {
        ConfSource src = { .file = (char *) "test.conf", .line = line };
        return conf_set(c, section, key, value, &src, &errors);
}

static int set(const char *section, const char *key, const char *value) {
        return set_at(next_line++, section, key, value);
}

static void set_ok(const char *section, const char *key, const char *value) {
        size_t n = errors.n_errors;
        int r = set(section, key, value);
        if (r != 0)
                fail_msg("[%s] %s=%s failed: %d (%s)", section, key, value, r,
                         errors.n_errors > n ? errors.errors[n].message : "no message");
}

/* The key is refused, with exactly one error that names it and contains needle. */
static void set_fails(const char *section, const char *key, const char *value, const char *needle) {
        size_t n = errors.n_errors;
        int r = set(section, key, value);
        if (r != -EINVAL)
                fail_msg("[%s] %s=%s returned %d, expected -EINVAL", section, key, value, r);
        assert_int_equal(errors.n_errors, n + 1);
        assert_non_null(errors.errors[n].key);
        assert_string_equal(errors.errors[n].key, key);
        if (needle && !strstr(errors.errors[n].message, needle))
                fail_msg("error \"%s\" does not contain \"%s\"", errors.errors[n].message, needle);
}

static bool has_error(const char *where, const char *key, const char *needle) {
        for (size_t i = 0; i < errors.n_errors; i++) {
                const ConfError *e = errors.errors + i;
                if ((!where || streq_ptr(e->where, where)) && (!key || streq_ptr(e->key, key)) &&
                    (!needle || strstr(e->message, needle)))
                        return true;
        }
        return false;
}

static void assert_has_error(const char *where, const char *key, const char *needle) {
        if (has_error(where, key, needle))
                return;
        for (size_t i = 0; i < errors.n_errors; i++)
                print_message("# error: %s: %s: %s\n", errors.errors[i].where ?: "-", errors.errors[i].key ?: "-",
                              errors.errors[i].message);
        fail_msg("no error at %s for key %s containing \"%s\"", where ?: "*", key ?: "*", needle ?: "*");
}

static char *dump(const BrokerConfig *config) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);
        assert_non_null(f);
        conf_dump(config, f);
        assert_int_equal(fclose(f), 0);
        return buf;
}

/* A minimal INI reader, enough for conf_dump()'s output (brokerd's reader is tested in test-config.c). */
static BrokerConfig *reparse(const char *text) {
        BrokerConfig *n = NULL;
        char section[4096] = "";
        unsigned line = 0;

        assert_int_equal(conf_new(&n), 0);
        for (const char *p = text; *p;) {
                const char *e = strchrnul(p, '\n');
                char buf[4096];
                ConfSource src = { .file = (char *) "dump", .line = ++line };

                assert_true((size_t) (e - p) < sizeof buf);
                memcpy(buf, p, (size_t) (e - p));
                buf[e - p] = '\0';
                p = *e ? e + 1 : e;

                if (buf[0] == '\0' || buf[0] == '#')
                        continue;
                if (buf[0] == '[') {
                        char *close = strchr(buf, ']');
                        assert_non_null(close);
                        *close = '\0';
                        memcpy(section, buf + 1, strlen(buf + 1) + 1);
                        assert_int_equal(conf_section_add(n, section, &src, &errors), 0);
                        continue;
                }
                char *eq = strchr(buf, '=');
                assert_non_null(eq);
                *eq = '\0';
                if (conf_set(n, section, buf, eq + 1, &src, &errors) != 0)
                        fail_msg("dump line %u (%s=%s) does not read back: %s", line, buf, eq + 1,
                                 errors.errors[errors.n_errors - 1].message);
        }
        return n;
}

static void assert_round_trips(const BrokerConfig *config) {
        char *a = dump(config);
        BrokerConfig *n = reparse(a);
        char *b = dump(n);
        if (!streq(a, b))
                fail_msg("dump does not read back the same:\n%s\n---\n%s", a, b);
        free(a);
        free(b);
        conf_free(n);
}

/* ---- defaults ---- */

static void test_new_config_has_documented_broker_defaults(void **state) {
        assert_null(c->socket_path);
        assert_null(c->state_directory);
        assert_int_equal(c->audit, AUDIT_DECISIONS);
        assert_int_equal(c->lease_persistence, LEASE_PERSISTENCE_REQUIRED);
        assert_true(c->history_retention == 30 * USEC_PER_DAY);
        assert_null(c->metrics_textfile);
        assert_true(c->reclaim_grace == 30 * USEC_PER_SEC);
        assert_true(c->revoke_grace == 5 * USEC_PER_SEC);
        assert_true(c->exit_idle_after == USEC_INFINITY);
        assert_int_equal(c->max_connections, 8192);
        assert_int_equal(c->max_connections_per_uid, 4096);
        assert_int_equal(c->max_waiters_per_uid, 4096);
        assert_int_equal(c->max_closing_fds_per_uid, 256);
        assert_int_equal(c->max_closing_fds, 4096);
        assert_int_equal(c->max_message_size, 65536);
        assert_int_equal(c->max_output_per_connection, 1024 * 1024);
        assert_int_equal(c->n_pools, 0);
        assert_int_equal(c->n_lanes, 0);
}

static void test_new_pool_has_documented_defaults(void **state) {
        set_ok("pool grid", "limit", "4");
        PoolConfig *p = conf_find_pool(c, "grid");
        assert_non_null(p);
        assert_int_equal(p->limit, 4);
        assert_null(p->members);
        assert_false(p->queue_timeout_set);
        assert_false(p->congestion_timeout_set);
        assert_int_equal(p->max_queue, -1);
        assert_null(p->backend);
}

static void test_new_lane_has_documented_defaults(void **state) {
        set_ok("lane ci", "pools", "grid");
        LaneConfig *l = conf_find_lane(c, "ci");
        assert_non_null(l);
        assert_int_equal(l->policy, LANE_POLICY_WAIT);
        assert_int_equal(l->priority, 0);
        assert_int_equal(l->max_in_use, -1);
        assert_int_equal(l->reserve, 0);
        assert_false(l->queue_timeout_set);
        assert_false(l->client_wait_ignore);
        assert_true(l->max_hold == USEC_INFINITY);
        assert_null(l->allow_users);
        assert_null(l->allow_groups);
}

static void test_embedded_default_matches_spec(void **state) {
        BrokerConfig *d = NULL;

        assert_int_equal(conf_new_default(6, &d), 0);
        assert_int_equal(d->n_pools, 1);
        PoolConfig *p = conf_find_pool(d, "default");
        assert_non_null(p);
        assert_int_equal(p->limit, 6);
        assert_true(p->queue_timeout_set);
        assert_true(p->queue_timeout == 5 * USEC_PER_MINUTE);
        assert_false(p->congestion_timeout_set);
        assert_int_equal(p->max_queue, -1);

        assert_int_equal(d->n_lanes, 2);
        LaneConfig *merge = conf_find_lane(d, "merge"), *nightly = conf_find_lane(d, "nightly");
        assert_non_null(merge);
        assert_int_equal(merge->policy, LANE_POLICY_FAIL_FAST);
        assert_int_equal(merge->n_pools, 1);
        assert_string_equal(merge->pools[0], "default");
        assert_false(merge->queue_timeout_set);
        assert_non_null(nightly);
        assert_int_equal(nightly->policy, LANE_POLICY_WAIT);
        assert_int_equal(nightly->n_pools, 1);
        assert_string_equal(nightly->pools[0], "default");
        assert_true(nightly->queue_timeout_set);
        assert_true(nightly->queue_timeout == USEC_INFINITY);

        assert_int_equal(conf_validate(d, &errors), 0);
        assert_int_equal(errors.n_errors, 0);
        assert_round_trips(d);
        conf_free(d);
}

static void test_embedded_default_has_at_least_one_slot(void **state) {
        BrokerConfig *d = NULL;
        assert_int_equal(conf_new_default(0, &d), 0);
        assert_int_equal(conf_find_pool(d, "default")->limit, 1);
        conf_free(d);
}

/* ---- [broker] ---- */

static void test_broker_paths_must_be_absolute(void **state) {
        set_ok("broker", "socket", "/run/test/io.slotbroker");
        assert_string_equal(c->socket_path, "/run/test/io.slotbroker");
        set_ok("broker", "state-directory", "/var/lib/test");
        assert_string_equal(c->state_directory, "/var/lib/test");
        set_ok("broker", "metrics-textfile", "/var/lib/node_exporter/slotbroker.prom");
        assert_string_equal(c->metrics_textfile, "/var/lib/node_exporter/slotbroker.prom");

        set_fails("broker", "socket", "run/x", "absolute path");
        set_fails("broker", "state-directory", "~/state", "absolute path");
        set_fails("broker", "metrics-textfile", "metrics.prom", "absolute path");
        set_fails("broker", "metrics-textfile", "/a ;b", "starts a comment");
        set_ok("broker", "metrics-textfile", "/a;b c");
        assert_string_equal(c->socket_path, "/run/test/io.slotbroker");
        assert_string_equal(c->metrics_textfile, "/a;b c");
}

static void test_broker_socket_path_fits_sockaddr_un(void **state) {
        char path[200] = "/";
        memset(path + 1, 'a', 106);
        set_ok("broker", "socket", path);
        path[107] = 'a';
        set_fails("broker", "socket", path, "too long");
}

static void test_broker_lease_persistence_is_required_or_best_effort(void **state) {
        set_ok("broker", "lease-persistence", "best-effort");
        assert_int_equal(c->lease_persistence, LEASE_PERSISTENCE_BEST_EFFORT);
        set_ok("broker", "lease-persistence", "required");
        assert_int_equal(c->lease_persistence, LEASE_PERSISTENCE_REQUIRED);
        set_fails("broker", "lease-persistence", "memory", "expected required or best-effort");
        set_ok("broker", "lease-persistence", "best-effort");
        set_ok("broker", "lease-persistence", ""); /* empty: the default again */
        assert_int_equal(c->lease_persistence, LEASE_PERSISTENCE_REQUIRED);
}

static void test_broker_audit_is_decisions_or_all(void **state) {
        set_ok("broker", "audit", "all");
        assert_int_equal(c->audit, AUDIT_ALL);
        set_ok("broker", "audit", "decisions");
        assert_int_equal(c->audit, AUDIT_DECISIONS);
        set_fails("broker", "audit", "ALL", "expected decisions or all");
        set_fails("broker", "audit", "yes", "\"yes\"");
}

static void test_broker_history_retention_is_a_positive_duration(void **state) {
        set_ok("broker", "history-retention", "7d");
        assert_true(c->history_retention == 7 * USEC_PER_DAY);
        set_ok("broker", "history-retention", "infinity");
        assert_true(c->history_retention == USEC_INFINITY);
        set_fails("broker", "history-retention", "0", "too short");
        set_fails("broker", "history-retention", "a month", "invalid duration");
}

static void test_broker_reclaim_grace_may_be_zero_but_not_infinity(void **state) {
        set_ok("broker", "reclaim-grace", "0");
        assert_true(c->reclaim_grace == 0);
        set_ok("broker", "reclaim-grace", "1min 30s");
        assert_true(c->reclaim_grace == 90 * USEC_PER_SEC);
        set_fails("broker", "reclaim-grace", "infinity", "finite");
}

static void test_broker_revoke_grace_may_be_zero_but_not_infinity(void **state) {
        set_ok("broker", "revoke-grace", "0");
        assert_true(c->revoke_grace == 0);
        set_ok("broker", "revoke-grace", "750ms");
        assert_true(c->revoke_grace == 750 * USEC_PER_MSEC);
        set_fails("broker", "revoke-grace", "infinity", "finite");
        set_fails("broker", "revoke-grace", "-1s", "invalid duration");
}

static void test_broker_exit_idle_after(void **state) {
        set_ok("broker", "exit-idle-after", "10min");
        assert_true(c->exit_idle_after == 10 * USEC_PER_MINUTE);
        set_ok("broker", "exit-idle-after", "infinity");
        assert_true(c->exit_idle_after == USEC_INFINITY);
        set_fails("broker", "exit-idle-after", "0", "too short");
}

static void test_broker_connection_limits_are_strict_integers(void **state) {
        set_ok("broker", "max-connections", "100");
        assert_int_equal(c->max_connections, 100);
        set_ok("broker", "max-connections-per-uid", "10");
        assert_int_equal(c->max_connections_per_uid, 10);
        set_ok("broker", "max-waiters-per-uid", "10000");
        assert_int_equal(c->max_waiters_per_uid, 10000);
        set_ok("broker", "max-closing-fds-per-uid", "16");
        assert_int_equal(c->max_closing_fds_per_uid, 16);
        set_ok("broker", "max-closing-fds", "100");
        assert_int_equal(c->max_closing_fds, 100);
        set_fails("broker", "max-closing-fds-per-uid", "0", "out of range");

        set_fails("broker", "max-connections", "0", "out of range");
        set_fails("broker", "max-connections", "-1", "invalid number");
        set_fails("broker", "max-connections", "10x", "invalid number");
        set_fails("broker", "max-connections", "1e3", "invalid number");
        set_fails("broker", "max-connections", "0x10", "invalid number");
        set_fails("broker", "max-connections", "+5", "invalid number");
        set_fails("broker", "max-connections", "1 000", "invalid number");
        set_fails("broker", "max-connections", "99999999999999999999999", "out of range");
        set_fails("broker", "max-connections", "4294967296", "out of range");
        set_fails("broker", "max-connections-per-uid", "0", "out of range");
        assert_int_equal(c->max_connections, 100);
}

static void test_broker_acquire_rates(void **state) {
        assert_true(c->max_acquire_rate_per_uid == 20 * 3600);
        assert_int_equal(c->max_acquire_burst_per_uid, 200);
        assert_true(c->max_acquire_rate == 200 * 3600);
        set_ok("broker", "max-acquire-rate-per-uid", "5/s");
        assert_true(c->max_acquire_rate_per_uid == 5 * 3600);
        set_ok("broker", "max-acquire-rate-per-uid", "30/min");
        assert_true(c->max_acquire_rate_per_uid == 30 * 60);
        set_ok("broker", "max-acquire-rate-per-uid", "7/h");
        assert_true(c->max_acquire_rate_per_uid == 7);
        set_ok("broker", "max-acquire-rate", "infinity");
        assert_true(c->max_acquire_rate == 0);
        set_ok("broker", "max-acquire-burst-per-uid", "1");
        assert_int_equal(c->max_acquire_burst_per_uid, 1);

        set_fails("broker", "max-acquire-rate-per-uid", "20", "invalid rate");
        set_fails("broker", "max-acquire-rate-per-uid", "20/day", "invalid rate");
        set_fails("broker", "max-acquire-rate-per-uid", "/s", "invalid rate");
        set_fails("broker", "max-acquire-rate-per-uid", "0/s", "out of range");
        set_fails("broker", "max-acquire-rate-per-uid", "-1/s", "out of range");
        set_fails("broker", "max-acquire-rate-per-uid", "1.5/s", "out of range");
        set_fails("broker", "max-acquire-rate-per-uid", "100001/s", "out of range");
        set_fails("broker", "max-acquire-rate-per-uid", "99999999999999999999999/s", "out of range");
        set_fails("broker", "max-acquire-burst-per-uid", "0", "out of range");
        assert_true(c->max_acquire_rate_per_uid == 7);
}

static void test_broker_max_waiters_per_uid_may_be_zero(void **state) {
        set_ok("broker", "max-waiters-per-uid", "0");
        assert_int_equal(c->max_waiters_per_uid, 0);
}

static void test_broker_sizes_accept_k_m_g_suffixes(void **state) {
        set_ok("broker", "max-message-size", "131072");
        assert_int_equal(c->max_message_size, 131072);
        set_ok("broker", "max-message-size", "64K");
        assert_int_equal(c->max_message_size, 65536);
        set_ok("broker", "max-message-size", "1M");
        assert_int_equal(c->max_message_size, 1024 * 1024);
        set_ok("broker", "max-message-size", "2MiB");
        assert_int_equal(c->max_message_size, 2 * 1024 * 1024);
        set_ok("broker", "max-output-per-connection", "1G");
        assert_int_equal(c->max_output_per_connection, 1024 * 1024 * 1024);
        set_ok("broker", "max-output-per-connection", "512K");
        assert_int_equal(c->max_output_per_connection, 512 * 1024);

        set_fails("broker", "max-message-size", "64k", "invalid size");
        set_fails("broker", "max-message-size", "1.5M", "invalid size");
        set_fails("broker", "max-message-size", "64 K", "invalid size");
        set_fails("broker", "max-message-size", "K", "invalid size");
        set_fails("broker", "max-message-size", "-64K", "invalid size");
        set_fails("broker", "max-message-size", "100", "out of range");
        set_fails("broker", "max-message-size", "1G", "out of range");
        set_fails("broker", "max-message-size", "99999999999999999999G", "out of range");
        set_fails("broker", "max-output-per-connection", "2G", "out of range");
        assert_int_equal(c->max_message_size, 2 * 1024 * 1024);
}

/* ---- [pool NAME] ---- */

static void test_pool_limit_is_a_positive_integer(void **state) {
        set_ok("pool grid", "limit", "4");
        assert_int_equal(conf_find_pool(c, "grid")->limit, 4);
        set_ok("pool grid", "limit", "1000000");
        set_fails("pool grid", "limit", "0", "out of range");
        set_fails("pool grid", "limit", "-4", "invalid number");
        set_fails("pool grid", "limit", "four", "\"four\"");
        set_fails("pool grid", "limit", "4 slots", "invalid number");
        set_fails("pool grid", "limit", "1000001", "out of range");
        set_fails("pool grid", "limit", "18446744073709551616", "out of range");
        assert_int_equal(conf_find_pool(c, "grid")->limit, 1000000);
}

static void test_pool_members_set_limit_to_their_count(void **state) {
        set_ok("pool rigs", "members", "rig-a rig-b  rig-c");
        PoolConfig *p = conf_find_pool(c, "rigs");
        assert_int_equal(p->limit, 3);
        assert_int_equal(p->n_members, 3);
        assert_string_equal(p->members[0], "rig-a");
        assert_string_equal(p->members[2], "rig-c");
        assert_null(p->members[3]);
        assert_int_equal(conf_validate(c, &errors), -EINVAL); /* no lane, but nothing about the pool */
        assert_false(has_error(NULL, "limit", NULL));
}

static void test_pool_members_must_be_valid_distinct_names(void **state) {
        set_fails("pool rigs", "members", "rig-a rig/b", "invalid member name \"rig/b\"");
        set_fails("pool rigs", "members", "rig-a rig-b rig-a", "listed twice");
        assert_null(conf_find_pool(c, "rigs"));
}

/* n distinct names PREFIX0 … PREFIX{n-1}, not in order, separated by spaces. */
static char *distinct_names(const char *prefix, size_t n) {
        char *text = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&text, &size);
        assert_non_null(f);
        for (size_t i = 0; i < n; i++)
                fprintf(f, "%s%s%zu", i ? " " : "", prefix, (i * 7919) % n);
        assert_int_equal(fclose(f), 0);
        return text;
}

/* The first name listed a second time is the one named, whatever comes after; an invalid name before it wins. And
 * checking a long list takes no scan of all names before each (200,000 members of a simulator scenario took
 * minutes): 100,000 here in well under a second of CPU. */
static void test_member_lists_with_duplicates_or_many_names(void **state) {
        set_fails("pool rigs", "members", "b a c a b", "member \"a\" is listed twice");
        set_fails("pool rigs", "members", "b a b a", "member \"b\" is listed twice");
        set_fails("pool rigs", "members", "a b! a", "invalid member name \"b!\"");
        set_fails("pool rigs", "members", "a a b!", "listed twice");

        /* Many distinct names, not in order, are all taken (the check sorts a copy; its cost is not timed here:
         * 100,000 members took 17.7 s of CPU with the pairwise check). */
        const size_t n = 10000;
        char *text = distinct_names("rig-", n);
        set_ok("pool rigs", "members", text);
        assert_int_equal(conf_find_pool(c, "rigs")->n_members, n);
        free(text);
}

static void test_pool_limit_and_member_count_must_agree(void **state) {
        set_ok("pool rigs", "members", "a b c");
        set_at(42, "pool rigs", "limit", "2");
        set_ok("lane l", "pools", "rigs");
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_has_error("test.conf:42", "limit", "limit=2 but 3 members");
}

static void test_pool_limit_equal_to_member_count_is_fine(void **state) {
        set_ok("pool rigs", "limit", "3");
        set_ok("pool rigs", "members", "a b c");
        set_ok("lane l", "pools", "rigs");
        assert_int_equal(conf_validate(c, &errors), 0);
        assert_int_equal(conf_find_pool(c, "rigs")->limit, 3);
}

static void test_pool_queue_timeout_infinity_means_unset(void **state) {
        PoolConfig *p;

        set_ok("pool grid", "queue-timeout", "5m");
        p = conf_find_pool(c, "grid");
        assert_true(p->queue_timeout_set);
        assert_true(p->queue_timeout == 5 * USEC_PER_MINUTE);
        set_ok("pool grid", "queue-timeout", "infinity");
        assert_false(p->queue_timeout_set);
        set_fails("pool grid", "queue-timeout", "0", "greater than 0");
        set_fails("pool grid", "queue-timeout", "5 minutes please", "invalid duration \"5 minutes please\"");
        set_fails("pool grid", "queue-timeout", "-5m", "invalid duration");
}

static void test_pool_congestion_timeout_needs_queue_timeout(void **state) {
        set_ok("pool grid", "limit", "2");
        set_at(7, "pool grid", "queue-congestion-timeout", "10s");
        set_ok("lane l", "pools", "grid");
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_has_error("test.conf:7", "queue-congestion-timeout", "no queue-timeout");
}

static void test_pool_congestion_timeout_above_queue_timeout_is_an_error(void **state) {
        set_ok("pool grid", "limit", "2");
        set_ok("pool grid", "queue-timeout", "1min");
        set_at(9, "pool grid", "queue-congestion-timeout", "2min");
        set_ok("lane l", "pools", "grid");
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_has_error("test.conf:9", "queue-congestion-timeout", "2min exceeds queue-timeout=1min");
}

static void test_pool_congestion_timeout_up_to_queue_timeout_and_zero_are_fine(void **state) {
        set_ok("pool grid", "limit", "2");
        set_ok("pool grid", "queue-timeout", "1min");
        set_ok("pool grid", "queue-congestion-timeout", "1min");
        set_ok("lane l", "pools", "grid");
        assert_int_equal(conf_validate(c, &errors), 0);
        set_ok("pool grid", "queue-congestion-timeout", "0");
        assert_true(conf_find_pool(c, "grid")->congestion_timeout_set);
        assert_int_equal(conf_validate(c, &errors), 0);
        set_fails("pool grid", "queue-congestion-timeout", "infinity", "finite");
}

static void test_pool_max_queue_accepts_zero_and_infinity(void **state) {
        set_ok("pool grid", "max-queue", "0");
        assert_int_equal(conf_find_pool(c, "grid")->max_queue, 0);
        set_ok("pool grid", "max-queue", "100");
        assert_int_equal(conf_find_pool(c, "grid")->max_queue, 100);
        set_ok("pool grid", "max-queue", "infinity");
        assert_int_equal(conf_find_pool(c, "grid")->max_queue, -1);
        set_fails("pool grid", "max-queue", "-1", "invalid number");
        set_fails("pool grid", "max-queue", "9223372036854775808", "out of range");
}

static void test_pool_backend_accepts_only_redis_urls(void **state) {
        static const char *const good[] = {
                "redis://localhost", "redis://redis.example.com:6379/0", "redis://10.0.0.1:6380", "redis://[::1]:6379/2",
                "redis://host/15", "unix:///run/redis/redis.sock", "unix:///run/redis/redis.sock?db=3",
                "redis-sentinel://s1,s2:26380,[::1]/grid-redis", "redis-sentinel://s1/m?db=2",
        };
        static const char *const bad[] = {
                "local", "http://x", "redis://", "redis://:6379", "redis://host:0", "redis://host:65536",
                "redis://host:port", "redis://host/db", "redis://user@host", "redis://host/1/2", "redis://[]:1",
                "unix://", "unix://relative.sock", "unix:///run/redis.sock?db=", "unix:///run/redis.sock?database=1",
                "redis-sentinel://s1", "redis-sentinel://s1,s1/m", "redis-sentinel://s1/m/0",
        };

        for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
                set_ok("pool grid", "backend", good[i]);
                assert_string_equal(conf_find_pool(c, "grid")->backend, good[i]);
        }
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
                set_fails("pool grid", "backend", bad[i],
                          "redis://HOST[:PORT][/DB], unix:///PATH[?db=DB], redis-sentinel://HOST[:PORT],…/MASTER[?db=DB]");
        set_fails("pool grid", "backend", "rediss://host:6380", "no TLS");
}

static void test_pool_min_replicas_needs_a_backend_and_a_short_timeout(void **state) {
        set_ok("pool grid", "limit", "2");
        set_ok("lane l", "pools", "grid");
        PoolConfig *p = conf_find_pool(c, "grid");
        assert_int_equal(p->backend_min_replicas, 0);
        assert_int_equal(p->backend_min_replicas_timeout, USEC_PER_SEC);
        set_ok("pool grid", "backend-min-replicas", "1");
        assert_int_equal(p->backend_min_replicas, 1);
        assert_int_not_equal(conf_validate(c, &errors), 0);
        assert_has_error(NULL, "backend-min-replicas", "needs a Redis backend=");
        set_ok("pool grid", "backend", "redis://localhost");
        conf_errors_done(&errors);
        assert_int_equal(conf_validate(c, &errors), 0);
        set_ok("pool grid", "backend-min-replicas-timeout", "250ms");
        assert_int_equal(p->backend_min_replicas_timeout, 250 * USEC_PER_MSEC);
        /* WAIT blocks the link and every call behind it: the link's 2 s command timeout bounds it. */
        set_fails("pool grid", "backend-min-replicas-timeout", "2s", NULL);
        set_fails("pool grid", "backend-min-replicas-timeout", "1ms", NULL);
        set_fails("pool grid", "backend-min-replicas", "65", NULL);
}

static void test_pool_cooldown_bounds_and_shared_pools(void **state) {
        set_ok("pool grid", "limit", "2");
        set_ok("lane l", "pools", "grid");
        PoolConfig *p = conf_find_pool(c, "grid");
        assert_int_equal(p->cooldown, 0);
        set_ok("pool grid", "cooldown", "90s");
        assert_int_equal(p->cooldown, 90 * USEC_PER_SEC);
        set_ok("pool grid", "cooldown", "1d");
        assert_int_equal(p->cooldown, 24 * USEC_PER_HOUR);
        set_fails("pool grid", "cooldown", "-5s", "negative");
        set_fails("pool grid", "cooldown", "25h", "too long (expected at most 1d)");
        set_fails("pool grid", "cooldown", "infinity", "finite");
        set_fails("pool grid", "cooldown", "5 parsecs", "invalid duration");
        set_fails("pool grid", "cooldown", "99999999999999999999s", "too long");
        assert_int_equal(p->cooldown, 24 * USEC_PER_HOUR); /* a refused value changes nothing */
        set_ok("pool grid", "cooldown", "");
        assert_int_equal(p->cooldown, 0);
        set_ok("pool grid", "cooldown", "0");
        assert_int_equal(p->cooldown, 0);
        set_at(31, "pool grid", "cooldown", "2min");
        assert_int_equal(conf_validate(c, &errors), 0);
        assert_round_trips(c);
        /* Shared pools take it too: a rule every node agrees to (brokerd/lua/README, "Rules canon"). */
        set_ok("pool grid", "backend", "redis://localhost");
        assert_int_equal(conf_validate(c, &errors), 0);
}

/* ---- [lane NAME] ---- */

static void test_lane_pools_keep_their_order(void **state) {
        set_ok("lane ci", "pools", "fast  slow\tspare");
        LaneConfig *l = conf_find_lane(c, "ci");
        assert_int_equal(l->n_pools, 3);
        assert_string_equal(l->pools[0], "fast");
        assert_string_equal(l->pools[1], "slow");
        assert_string_equal(l->pools[2], "spare");
        assert_null(l->pools[3]);
}

static void test_lane_pools_must_be_valid_distinct_names(void **state) {
        set_fails("lane ci", "pools", "a a", "listed twice");
        set_fails("lane ci", "pools", "a,b", "invalid pool name \"a,b\"");
}

static void test_lane_policy_is_fail_fast_or_wait(void **state) {
        set_ok("lane ci", "policy", "fail-fast");
        assert_int_equal(conf_find_lane(c, "ci")->policy, LANE_POLICY_FAIL_FAST);
        set_ok("lane ci", "policy", "wait");
        assert_int_equal(conf_find_lane(c, "ci")->policy, LANE_POLICY_WAIT);
        set_fails("lane ci", "policy", "failfast", "expected fail-fast or wait");
        set_fails("lane ci", "policy", "Wait", NULL);
}

static void test_lane_priority_is_a_signed_int(void **state) {
        set_ok("lane ci", "priority", "10");
        assert_int_equal(conf_find_lane(c, "ci")->priority, 10);
        set_ok("lane ci", "priority", "-5");
        assert_int_equal(conf_find_lane(c, "ci")->priority, -5);
        set_ok("lane ci", "priority", "2147483647");
        assert_int_equal(conf_find_lane(c, "ci")->priority, INT_MAX);
        set_ok("lane ci", "priority", "-2147483648");
        assert_int_equal(conf_find_lane(c, "ci")->priority, INT_MIN);
        set_fails("lane ci", "priority", "2147483648", "out of range");
        set_fails("lane ci", "priority", "-2147483649", "out of range");
        set_fails("lane ci", "priority", "high", "invalid number");
        set_fails("lane ci", "priority", "-", "invalid number");
        set_fails("lane ci", "priority", "--1", "invalid number");
}

static void test_lane_max_in_use_is_at_least_one(void **state) {
        set_ok("lane ci", "max-in-use", "2");
        assert_int_equal(conf_find_lane(c, "ci")->max_in_use, 2);
        set_ok("lane ci", "max-in-use", "infinity");
        assert_int_equal(conf_find_lane(c, "ci")->max_in_use, -1);
        set_fails("lane ci", "max-in-use", "0", "out of range");
        set_fails("lane ci", "max-in-use", "-1", "invalid number");
}

static void test_lane_reserve(void **state) {
        set_ok("lane ci", "reserve", "1");
        assert_int_equal(conf_find_lane(c, "ci")->reserve, 1);
        set_ok("lane ci", "reserve", "0");
        assert_int_equal(conf_find_lane(c, "ci")->reserve, 0);
        set_fails("lane ci", "reserve", "-1", "invalid number");
}

static void test_lane_queue_timeout_infinity_is_a_value(void **state) {
        set_ok("lane ci", "queue-timeout", "infinity");
        LaneConfig *l = conf_find_lane(c, "ci");
        assert_true(l->queue_timeout_set);
        assert_true(l->queue_timeout == USEC_INFINITY);
        set_ok("lane ci", "queue-timeout", "90s");
        assert_true(l->queue_timeout == 90 * USEC_PER_SEC);
        set_fails("lane ci", "queue-timeout", "0", "greater than 0");
}

static void test_lane_client_wait_is_honor_or_ignore(void **state) {
        set_ok("lane ci", "client-wait", "ignore");
        assert_true(conf_find_lane(c, "ci")->client_wait_ignore);
        set_ok("lane ci", "client-wait", "honor");
        assert_false(conf_find_lane(c, "ci")->client_wait_ignore);
        set_fails("lane ci", "client-wait", "no", "expected honor or ignore");
}

static void test_lane_max_hold(void **state) {
        set_ok("lane ci", "max-hold", "2h");
        assert_true(conf_find_lane(c, "ci")->max_hold == 2 * USEC_PER_HOUR);
        set_ok("lane ci", "max-hold", "infinity");
        assert_true(conf_find_lane(c, "ci")->max_hold == USEC_INFINITY);
        set_fails("lane ci", "max-hold", "0", "too short");
}

static void test_lane_allow_lists_take_names_and_ids(void **state) {
        set_ok("lane ci", "allow-users", "root 1000 gitlab-runner _apt jenkins$");
        LaneConfig *l = conf_find_lane(c, "ci");
        assert_string_equal(l->allow_users[0], "root");
        assert_string_equal(l->allow_users[1], "1000");
        assert_string_equal(l->allow_users[4], "jenkins$");
        assert_null(l->allow_users[5]);
        set_ok("lane ci", "allow-groups", "ci 0 4294967294");
        assert_string_equal(l->allow_groups[2], "4294967294");

        set_fails("lane ci", "allow-users", "a:b", "invalid user \"a:b\"");
        set_fails("lane ci", "allow-users", "a;b", NULL);
        set_fails("lane ci", "allow-users", "-x", NULL);
        set_fails("lane ci", "allow-groups", "4294967295", "invalid group");
        set_fails("lane ci", "allow-groups", "a/b", NULL);
        set_fails("lane ci", "allow-groups", "..", NULL);
        assert_string_equal(l->allow_groups[0], "ci");
}

/* ---- the rules every key follows ---- */

static void test_empty_value_resets_every_key_to_its_default(void **state) {
        static const struct {
                const char *section, *key, *value;
        } settings[] = {
                { "broker", "socket", "/run/x" },
                { "broker", "state-directory", "/var/x" },
                { "broker", "audit", "all" },
                { "broker", "history-retention", "1d" },
                { "broker", "metrics-textfile", "/x.prom" },
                { "broker", "reclaim-grace", "1s" },
                { "broker", "exit-idle-after", "1h" },
                { "broker", "max-connections", "5" },
                { "broker", "max-connections-per-uid", "5" },
                { "broker", "max-waiters-per-uid", "5" },
                { "broker", "max-closing-fds-per-uid", "5" },
                { "broker", "max-closing-fds", "5" },
                { "broker", "max-message-size", "2K" },
                { "broker", "max-output-per-connection", "8K" },
                { "pool p", "limit", "3" },
                { "pool p", "members", "a b" },
                { "pool p", "queue-timeout", "1min" },
                { "pool p", "queue-congestion-timeout", "5s" },
                { "pool p", "max-queue", "5" },
                { "pool p", "backend", "redis://h" },
                { "lane l", "pools", "p" },
                { "lane l", "policy", "fail-fast" },
                { "lane l", "priority", "3" },
                { "lane l", "max-in-use", "2" },
                { "lane l", "reserve", "1" },
                { "lane l", "queue-timeout", "1s" },
                { "lane l", "client-wait", "ignore" },
                { "lane l", "max-hold", "1h" },
                { "lane l", "allow-users", "root" },
                { "lane l", "allow-groups", "wheel" },
        };

        /* The reference: both sections exist with nothing set. */
        BrokerConfig *fresh = NULL;
        ConfSource src = { .file = (char *) "x", .line = 1 };
        assert_int_equal(conf_new(&fresh), 0);
        assert_int_equal(conf_section_add(fresh, "pool p", &src, NULL), 0);
        assert_int_equal(conf_section_add(fresh, "lane l", &src, NULL), 0);
        char *expected = dump(fresh);
        conf_free(fresh);

        for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++)
                set_ok(settings[i].section, settings[i].key, settings[i].value);
        char *changed = dump(c);
        assert_string_not_equal(changed, expected);
        for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
                set_ok(settings[i].section, settings[i].key, "");
                /* and the key is really back: setting it empty twice changes nothing */
                set_ok(settings[i].section, settings[i].key, "  ");
        }
        char *reset = dump(c);
        assert_string_equal(reset, expected);
        free(expected);
        free(changed);
        free(reset);
}

static void test_later_assignment_replaces_earlier(void **state) {
        set_ok("pool grid", "limit", "2");
        set_ok("pool grid", "limit", "5");
        assert_int_equal(conf_find_pool(c, "grid")->limit, 5);
        set_ok("lane ci", "pools", "a b");
        set_ok("lane ci", "pools", "c");
        assert_int_equal(conf_find_lane(c, "ci")->n_pools, 1);
        assert_string_equal(conf_find_lane(c, "ci")->pools[0], "c");
        set_ok("lane ci", "allow-users", "alice");
        set_ok("lane ci", "allow-users", "bob");
        assert_string_equal(conf_find_lane(c, "ci")->allow_users[0], "bob");
        assert_null(conf_find_lane(c, "ci")->allow_users[1]);
}

static void test_unknown_key_is_an_error_listing_known_keys(void **state) {
        set_fails("broker", "sockets", "/x", "unknown key in [broker]");
        set_fails("pool grid", "limits", "3", "known keys: limit, members");
        set_fails("lane ci", "queue_timeout", "3", "queue-timeout");
        assert_null(conf_find_pool(c, "grid"));
        assert_null(conf_find_lane(c, "ci"));
}

static void test_unknown_section_is_an_error(void **state) {
        assert_int_equal(set("pools grid", "limit", "3"), -EINVAL);
        assert_has_error("test.conf:1", "limit", "unknown section [pools grid]");
        assert_int_equal(set("Broker", "audit", "all"), -EINVAL);
        assert_has_error("test.conf:2", "audit", "unknown section [Broker]");
        assert_int_equal(set("", "audit", "all"), -EINVAL);
        assert_has_error("test.conf:3", "audit", "outside of any section");
}

static void test_section_names_are_checked(void **state) {
        char name[100];

        memset(name, 'n', sizeof name);
        memcpy(name, "pool ", 5);
        name[5 + 64] = '\0';
        set_ok(name, "limit", "1");
        name[5 + 64] = 'n';
        name[5 + 65] = '\0';
        assert_int_equal(set(name, "limit", "1"), -EINVAL);
        assert_has_error(NULL, NULL, "invalid pool name");

        set_ok("pool A-z_0.9", "limit", "1");
        set_ok("pool\t spaced", "limit", "1");
        assert_non_null(conf_find_pool(c, "spaced"));
        assert_int_equal(set("pool a/b", "limit", "1"), -EINVAL);
        assert_int_equal(set("pool", "limit", "1"), -EINVAL);
        assert_has_error(NULL, NULL, "needs a name");
        assert_int_equal(set("lane a b", "pools", "x"), -EINVAL);
        assert_has_error(NULL, NULL, "takes one name");
        assert_int_equal(set("broker x", "audit", "all"), -EINVAL);
        assert_has_error(NULL, NULL, "takes no name");
        assert_int_equal(c->n_lanes, 0);
}

static void test_name_validity(void **state) {
        assert_true(conf_name_is_valid("grid"));
        assert_true(conf_name_is_valid("rig-a.b_c9"));
        assert_false(conf_name_is_valid(""));
        assert_false(conf_name_is_valid(NULL));
        assert_false(conf_name_is_valid("a b"));
        assert_false(conf_name_is_valid("a,b"));
        assert_false(conf_name_is_valid("grïd"));
        char n[70];
        memset(n, 'x', sizeof n);
        n[64] = '\0';
        assert_true(conf_name_is_valid(n));
        n[64] = 'x';
        n[65] = '\0';
        assert_false(conf_name_is_valid(n));
}

static void test_reason_validity(void **state) {
        assert_true(conf_reason_is_valid("reflashing the usb hub"));
        assert_true(conf_reason_is_valid("grïd – naïve ✓ \xc2\xa0nbsp"));  /* Unicode is fine, U+00A0 too */
        assert_true(conf_reason_is_valid("a\xe2\x80\xa7" "b"));               /* U+2027, next to the separators */
        assert_false(conf_reason_is_valid(NULL));
        assert_false(conf_reason_is_valid(""));
        assert_false(conf_reason_is_valid("two\nlines"));
        assert_false(conf_reason_is_valid("a\tb"));
        assert_false(conf_reason_is_valid("del\x7f"));
        assert_false(conf_reason_is_valid("c1 \xc2\x85 next line"));    /* U+0085: journalctl's [blob data] */
        assert_false(conf_reason_is_valid("c1 \xc2\x9b" " csi"));          /* U+009B: a terminal's CSI */
        assert_false(conf_reason_is_valid("\xe2\x80\xa8"));             /* U+2028 LINE SEPARATOR */
        assert_false(conf_reason_is_valid("x\xe2\x80\xa9" "y"));           /* U+2029 PARAGRAPH SEPARATOR */
        assert_true(conf_reason_is_valid("cut \xc2"));  /* a lead byte last: read no further (UTF-8 is JSON's to check) */
        char r[CONF_REASON_MAX + 2];
        memset(r, 'x', sizeof r);
        r[CONF_REASON_MAX] = '\0';
        assert_true(conf_reason_is_valid(r));
        r[CONF_REASON_MAX] = 'x';
        r[CONF_REASON_MAX + 1] = '\0';
        assert_false(conf_reason_is_valid(r));
}

static void test_failed_key_leaves_no_trace(void **state) {
        set_fails("pool grid", "limit", "zero", NULL);
        assert_null(conf_find_pool(c, "grid"));
        set_fails("lane ci", "policy", "sometimes", NULL);
        assert_null(conf_find_lane(c, "ci"));

        set_ok("pool grid", "queue-timeout", "1min");
        set_fails("pool grid", "queue-timeout", "soon", NULL);
        assert_true(conf_find_pool(c, "grid")->queue_timeout == USEC_PER_MINUTE);
        set_ok("pool grid", "members", "a b");
        set_fails("pool grid", "members", "a a", NULL);
        assert_int_equal(conf_find_pool(c, "grid")->n_members, 2);
}

static void test_surrounding_whitespace_is_ignored(void **state) {
        set_ok("pool grid", "limit", "  4\t");
        assert_int_equal(conf_find_pool(c, "grid")->limit, 4);
        set_ok("broker", "audit", " all ");
        assert_int_equal(c->audit, AUDIT_ALL);
}

static void test_control_characters_are_refused(void **state) {
        set_fails("broker", "socket", "/run/a\x01" "b", "control character");
        set_fails("broker", "socket", "/run/a\nb", "\\x0a");
}

static void test_error_names_file_line_key_and_value(void **state) {
        char buf[512];
        FILE *f;

        assert_int_equal(set_at(17, "pool grid", "queue-timeout", "5 minutes please"), -EINVAL);
        assert_int_equal(errors.n_errors, 1);
        assert_string_equal(errors.errors[0].where, "test.conf:17");
        assert_string_equal(errors.errors[0].key, "queue-timeout");
        assert_non_null(strstr(errors.errors[0].message, "invalid duration \"5 minutes please\""));
        assert_non_null(strstr(errors.errors[0].message, "expected"));

        f = fmemopen(buf, sizeof buf, "w");
        conf_errors_print(&errors, f);
        fclose(f);
        assert_true(strncmp(buf, "test.conf:17: queue-timeout: invalid duration \"5 minutes please\" (expected ", 75) ==
                    0);
}

static void test_errors_without_source_print_without_where(void **state) {
        char buf[256];
        FILE *f;

        assert_int_equal(conf_set(c, "broker", "audit", "nope", NULL, &errors), -EINVAL);
        assert_null(errors.errors[0].where);
        f = fmemopen(buf, sizeof buf, "w");
        conf_errors_print(&errors, f);
        fclose(f);
        assert_true(strncmp(buf, "audit: invalid audit level", 26) == 0);
}

static void test_errors_carry_no_control_characters(void **state) {
        ConfSource src = { .file = (char *) "evil\x1b[2J\xc2\x9b" "2J\xe2\x80\xa8.conf", .line = 1 };
        char key[200];

        assert_int_equal(conf_set(c, "\x1b]0;owned\x07", "k\x1b", "v", &src, &errors), -EINVAL);
        memset(key, 'k', sizeof key);
        key[sizeof key - 1] = '\0';
        assert_int_equal(conf_set(c, "broker", key, "v", &src, &errors), -EINVAL);
        for (size_t i = 0; i < errors.n_errors; i++)
                for (const char *s[] = { errors.errors[i].where, errors.errors[i].key, errors.errors[i].message }, **p = s;
                     p < s + 3; p++)
                        for (const char *q = *p; q && *q; q++) {
                                assert_false((unsigned char) *q < 0x20 || *q == 0x7f);
                                assert_false(q[0] == '\xc2' && (unsigned char) q[1] >= 0x80 && (unsigned char) q[1] <= 0x9f);
                                assert_false(q[0] == '\xe2' && q[1] == '\x80' && (q[2] == '\xa8' || q[2] == '\xa9'));
                        }
        assert_true(strlen(errors.errors[1].key) < 80);
}

static void test_long_values_are_cut_in_messages(void **state) {
        char v[500];
        memset(v, '7', sizeof v);
        v[sizeof v - 1] = '\0';
        v[0] = 'x';
        set_fails("broker", "max-connections", v, "...");
        assert_true(strlen(errors.errors[0].message) < 200);
}

static void test_errors_are_capped(void **state) {
        for (int i = 0; i < CONF_ERRORS_MAX + 10; i++)
                (void) set("broker", "audit", "nope");
        assert_int_equal(errors.n_errors, CONF_ERRORS_MAX);
        assert_int_equal(errors.n_dropped, 10);
}

static void test_section_add_creates_an_empty_section_at_its_header(void **state) {
        ConfSource src = { .file = (char *) "test.conf", .line = 3 };
        char where[64];

        assert_int_equal(conf_section_add(c, "pool grid", &src, &errors), 0);
        PoolConfig *p = conf_find_pool(c, "grid");
        assert_non_null(p);
        assert_string_equal(conf_source_where(&p->source, where, sizeof where), "test.conf:3");
        assert_int_equal(conf_section_add(c, "broker", &src, &errors), 0);
        assert_int_equal(conf_section_add(c, "pool bad/name", &src, &errors), -EINVAL);
        assert_int_equal(conf_section_add(c, "frobnicate", &src, &errors), -EINVAL);
        assert_int_equal(errors.n_errors, 2);
        assert_null(errors.errors[0].key);
}

static void test_too_many_sections_is_an_error(void **state) {
        char name[32];
        for (int i = 0; i < CONF_SECTIONS_MAX; i++) {
                snprintf(name, sizeof name, "pool p%d", i);
                set_ok(name, "limit", "1");
        }
        set_fails("pool one-more", "limit", "1", "too many pools");
}

/* ---- conf_validate ---- */

static void valid_config(void) {
        set_ok("pool grid", "limit", "4");
        set_ok("pool grid", "queue-timeout", "5min");
        set_ok("lane merge", "pools", "grid");
        set_ok("lane merge", "policy", "fail-fast");
}

static void test_validate_accepts_a_minimal_config(void **state) {
        valid_config();
        assert_int_equal(conf_validate(c, &errors), 0);
        assert_int_equal(errors.n_errors, 0);
}

static void test_validate_requires_a_lane(void **state) {
        set_ok("pool grid", "limit", "4");
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_has_error(NULL, NULL, "no lane is configured");
}

static void test_validate_lane_needs_a_pool(void **state) {
        ConfSource src = { .file = (char *) "test.conf", .line = 30 };
        valid_config();
        assert_int_equal(conf_section_add(c, "lane empty", &src, &errors), 0);
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_has_error("test.conf:30", "pools", "lane empty names no pool");
}

static void test_validate_lane_may_name_only_existing_pools(void **state) {
        valid_config();
        set_at(12, "lane nightly", "pools", "grid gpu");
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_has_error("test.conf:12", "pools", "names pool gpu, which is not defined");
}

static void test_validate_pool_needs_limit_or_members(void **state) {
        ConfSource src = { .file = (char *) "test.conf", .line = 20 };
        valid_config();
        assert_int_equal(conf_section_add(c, "pool empty", &src, &errors), 0);
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_has_error("test.conf:20", "limit", "pool empty has no slots");
}

static void test_validate_reserves_must_fit_the_limit(void **state) {
        valid_config();
        set_ok("lane merge", "reserve", "3");
        set_ok("lane nightly", "pools", "grid");
        set_at(50, "lane nightly", "reserve", "2");
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_has_error("test.conf:50", "reserve", "lanes reserve 5 slots of pool grid, which has 4");
}

static void test_validate_reserves_equal_to_the_limit_are_fine_when_no_lane_starves(void **state) {
        valid_config();
        set_ok("lane merge", "reserve", "2");
        set_ok("lane nightly", "pools", "grid");
        set_ok("lane nightly", "reserve", "2");
        assert_int_equal(conf_validate(c, &errors), 0);
}

static void test_validate_lane_starved_by_other_reserves(void **state) {
        valid_config();
        set_ok("lane merge", "reserve", "4");
        set_at(60, "lane nightly", "pools", "grid");
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_has_error("test.conf:60", "pools", "lane nightly could never get a slot of pool grid");
}

static void test_validate_reserve_above_max_in_use(void **state) {
        valid_config();
        set_ok("lane merge", "max-in-use", "1");
        set_at(70, "lane merge", "reserve", "2");
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_has_error("test.conf:70", "reserve", "reserves 2 slots but may use only 1");
}

static void test_validate_catches_bad_values_set_directly(void **state) {
        valid_config();
        conf_find_lane(c, "merge")->max_in_use = 0;
        conf_find_lane(c, "merge")->policy = 7;
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_has_error(NULL, "max-in-use", "expected at least 1");
        assert_has_error(NULL, "policy", NULL);
}

static void test_validate_reports_every_problem(void **state) {
        ConfSource src = { .file = (char *) "test.conf", .line = 1 };
        assert_int_equal(conf_section_add(c, "pool empty", &src, &errors), 0);
        set_ok("pool grid", "limit", "2");
        set_ok("pool grid", "queue-congestion-timeout", "1s");
        set_ok("pool rigs", "members", "a b");
        set_ok("pool rigs", "limit", "3");
        set_ok("lane a", "pools", "nope grid");
        set_ok("lane a", "reserve", "3");
        assert_int_equal(conf_section_add(c, "lane b", &src, &errors), 0);

        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_has_error(NULL, "limit", "pool empty has no slots");
        assert_has_error(NULL, "queue-congestion-timeout", "no queue-timeout");
        assert_has_error(NULL, "limit", "limit=3 but 2 members");
        assert_has_error(NULL, "pools", "names pool nope");
        assert_has_error(NULL, "reserve", "lanes reserve 3 slots of pool grid, which has 2");
        assert_has_error(NULL, "pools", "lane b names no pool");
        assert_int_equal(errors.n_errors, 6);
}

/* ---- labels (SPEC §3.5) ---- */

static void test_pool_labels_name_members(void **state) {
        set_ok("pool rigs", "members", "a b c");
        set_ok("pool rigs", "label.arm64", "a b");
        set_ok("pool rigs", "label.usb_3.x-y", "c");
        set_ok("pool rigs", "label.arm64", "b"); /* later wins */
        PoolConfig *p = conf_find_pool(c, "rigs");
        assert_int_equal(p->n_labels, 2);
        assert_string_equal(p->labels[0].name, "arm64");
        assert_string_equal(p->labels[0].members[0], "b");
        assert_null(p->labels[0].members[1]);
        set_ok("lane l", "pools", "rigs");
        set_ok("lane l", "labels", "arm64 !usb_3.x-y");
        assert_int_equal(conf_validate(c, &errors), 0);
}

static void test_pool_label_names_and_members_must_be_valid(void **state) {
        set_fails("pool rigs", "label.Arm64", "a", "invalid label name \"Arm64\"");
        set_fails("pool rigs", "label.", "a", "invalid label name");
        set_fails("pool rigs", "label.a/b", "a", "invalid label name");
        set_fails("pool rigs", "label.x", "a a", "listed twice");
        set_fails("pool rigs", "label.x", "a b/c", "invalid member name");
        set_fails("lane l", "labels", "arm64 !", "invalid label \"!\"");
        set_fails("lane l", "labels", "!!arm64", "invalid label");
        set_fails("lane l", "labels", "arm64 arm64", "listed twice");
}

static void test_validate_labels_need_members_and_name_known_ones(void **state) {
        valid_config();
        set_at(80, "pool grid", "label.fast", "a");
        set_ok("pool rigs", "members", "a b");
        set_at(81, "pool rigs", "label.fast", "a z");
        set_ok("pool shared", "members", "a b");
        set_ok("pool shared", "backend", "redis://127.0.0.1:6379");
        set_at(82, "pool shared", "label.fast", "a");
        set_ok("lane nightly", "pools", "grid");
        set_at(83, "lane nightly", "labels", "fast");
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_has_error("test.conf:80", "label.fast", "pool grid has no members=");
        assert_has_error("test.conf:81", "label.fast", "names z, which is not a member of pool rigs");
        /* A shared pool's labels are part of its agreed rules (SPEC §3.5): taken. */
        assert_false(has_error("test.conf:82", NULL, NULL));
        assert_has_error("test.conf:83", "labels", "lane nightly has labels= but none of its pools");
}

/* SPEC §3.5: a selector no member can ever match is InvalidParameter. A lane's own labels= that no member of its
 * pools can satisfy would make every request of the lane one: the operator hears it from --check-config (and a
 * reload is refused), not from each client. A label no pool defines is carried by none; "!L" of it by all. */
static void test_validate_lane_labels_some_member_can_satisfy(void **state) {
        valid_config();
        set_ok("pool rigs", "members", "a b c");
        set_ok("pool rigs", "label.arm64", "a b");
        set_ok("pool rigs", "label.usb3", "c");
        set_ok("pool rigs2", "members", "x");
        set_ok("pool rigs2", "label.gpu", "x");
        set_ok("lane ok", "pools", "rigs");
        set_at(70, "lane ok", "labels", "arm64 !usb3");
        set_ok("lane unknown", "pools", "rigs");
        set_at(71, "lane unknown", "labels", "gpu");              /* only rigs2 defines it */
        set_ok("lane none", "pools", "rigs");
        set_at(72, "lane none", "labels", "arm64 usb3");          /* no member carries both */
        set_ok("lane contradiction", "pools", "rigs");
        set_at(73, "lane contradiction", "labels", "arm64 !arm64");
        set_ok("lane second", "pools", "grid rigs rigs2");
        set_at(74, "lane second", "labels", "gpu");               /* rigs2, its third choice, can */
        set_ok("lane absent", "pools", "rigs");
        set_at(75, "lane absent", "labels", "!nosuch");            /* every member */
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_false(has_error("test.conf:70", NULL, NULL));
        assert_has_error("test.conf:71", "labels", "lane unknown has labels=gpu, which no member of its pools satisfies");
        assert_has_error("test.conf:72", "labels", "lane none has labels=arm64 usb3, which no member of its pools satisfies");
        assert_has_error("test.conf:73", "labels", "lane contradiction has labels=arm64 !arm64, which no member");
        assert_false(has_error("test.conf:74", NULL, NULL));
        assert_false(has_error("test.conf:75", NULL, NULL));
}

/* The errors of labels naming members a pool does not have come in the order of the labels, then of each label's
 * list, one for each such name, whatever order the members are listed in (the check looks names up in a sorted
 * index, not in the list). Names differ from members only by case or a prefix. */
static void test_validate_label_unknown_members_in_list_order(void **state) {
        valid_config();
        set_ok("pool rigs", "members", "m-3 m-1 m-2 M-4 m-10");
        set_at(90, "pool rigs", "label.b", "m-9 m-1 m- m-10 M-1");
        set_at(91, "pool rigs", "label.a", "m-4 m-3 m-2 m-20");
        set_at(92, "pool rigs", "label.c", "");
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        static const char *const expected[][2] = {
                { "test.conf:90", "label b names m-9, which is not a member of pool rigs (members=)" },
                { "test.conf:90", "label b names m-, which is not a member of pool rigs (members=)" },
                { "test.conf:90", "label b names M-1, which is not a member of pool rigs (members=)" },
                { "test.conf:91", "label a names m-4, which is not a member of pool rigs (members=)" },
                { "test.conf:91", "label a names m-20, which is not a member of pool rigs (members=)" },
        };
        assert_int_equal(errors.n_errors, ELEMENTSOF(expected));
        for (size_t i = 0; i < ELEMENTSOF(expected); i++) {
                assert_string_equal(errors.errors[i].where, expected[i][0]);
                assert_string_equal(errors.errors[i].message, expected[i][1]);
        }
}

/* A lane's labels= against a pool whose members and labels list names in other orders, a label naming a member
 * the pool lacks (an error of its own, and carried by no member), a label set twice (the later list counts), and
 * terms of labels the pool does not define: satisfiable exactly when some member carries each "L" and none of
 * the "!L". */
static void test_validate_lane_labels_against_unordered_members(void **state) {
        valid_config();
        set_ok("pool rigs", "members", "r5 r3 r1 r4 r2");
        set_ok("pool rigs", "label.odd", "r1 r5 r3");
        set_ok("pool rigs", "label.low", "r2 r1");
        set_ok("pool rigs", "label.ghost", "r9");
        set_ok("pool rigs", "label.top", "r4");
        set_ok("pool rigs", "label.top", "r5"); /* later wins */
        static const struct {
                const char *labels;
                bool satisfiable;
        } cases[] = {
                { "odd low", true },          /* r1 */
                { "odd !low", true },         /* r3, r5 */
                { "!odd !low", true },        /* r4 */
                { "odd low top", false },
                { "top odd", true },          /* r5 */
                { "top !odd", false },        /* r4 was top once */
                { "ghost", false },
                { "!ghost odd top", true },
                { "nosuch", false },
                { "!nosuch !odd !low !top", true },
                { "!odd !low !top", true },   /* r4 */
                { "!odd !low !top !nosuch2 low", false },
        };
        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                char section[32];
                snprintf(section, sizeof section, "lane l%zu", i);
                set_ok(section, "pools", "rigs");
                set_at(200 + (unsigned) i, section, "labels", cases[i].labels);
        }
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_has_error(NULL, "label.ghost", "label ghost names r9, which is not a member of pool rigs");
        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                char where[32];
                snprintf(where, sizeof where, "test.conf:%zu", 200 + i);
                if (has_error(where, "labels", "which no member of its pools satisfies") == cases[i].satisfiable)
                        fail_msg("lane l%zu labels=%s: expected %s", i, cases[i].labels,
                                 cases[i].satisfiable ? "satisfiable" : "an error");
        }
        assert_int_equal(errors.n_errors, 1 + 5);
}

/* A lane's labels= with a term listed twice or an invalid one: the first offending term in list order is named,
 * an invalid one before a repeat, as for member lists; a long list is checked before its length is refused. */
static void test_lane_labels_first_offending_term_is_named(void **state) {
        set_fails("lane l", "labels", "b a c a b", "label \"a\" is listed twice");
        set_fails("lane l", "labels", "b !a b !a", "label \"b\" is listed twice");
        set_fails("lane l", "labels", "a !a a", "label \"a\" is listed twice");
        set_fails("lane l", "labels", "a B a", "invalid label \"B\"");
        set_fails("lane l", "labels", "a a B", "label \"a\" is listed twice");

        char *text = distinct_names("l", 20000);
        set_fails("lane l", "labels", text, "20000 labels are too many");
        free(text);
}

static void test_quarantine_exit_codes_are_1_to_255(void **state) {
        set_ok("pool rigs", "members", "a b");
        set_fails("pool rigs", "quarantine-exit-codes", "0", "expected integers from 1 to 255");
        set_fails("pool rigs", "quarantine-exit-codes", "256", "expected integers from 1 to 255");
        set_fails("pool rigs", "quarantine-exit-codes", "-3", "expected integers from 1 to 255");
        set_fails("pool rigs", "quarantine-exit-codes", "3 x", "expected integers from 1 to 255");
        set_fails("pool rigs", "quarantine-exit-codes", "3 3", "listed twice");
        set_ok("pool rigs", "quarantine-exit-codes", "3 4 255");
        PoolConfig *p = conf_find_pool(c, "rigs");
        assert_true(pool_config_quarantines(p, 3));
        assert_true(pool_config_quarantines(p, 255));
        assert_false(pool_config_quarantines(p, 0));
        assert_false(pool_config_quarantines(p, 5));
        assert_false(pool_config_quarantines(p, 256));
        assert_false(pool_config_quarantines(p, -1));
        assert_int_equal(p->quarantine_after, 1);
        set_fails("pool rigs", "quarantine-after", "0", "out of range");
        set_fails("pool rigs", "quarantine-after", "1001", "out of range");
        set_ok("pool rigs", "quarantine-after", "3");
        assert_int_equal(p->quarantine_after, 3);
        set_fails("lane check", "health", "maybe", "expected yes, also or no");
        set_ok("lane check", "health", "also");
        assert_true(conf_find_lane(c, "check")->health);
        assert_true(conf_find_lane(c, "check")->health_also);
        set_ok("lane check", "health", "yes");
        assert_true(conf_find_lane(c, "check")->health);
        assert_false(conf_find_lane(c, "check")->health_also);
        set_ok("pool rigs", "admin-users", "alice 1000");
        set_fails("pool rigs", "admin-groups", "bad:name", "invalid group");
}

static void test_validate_quarantine_is_taken_on_shared_pools_refused_on_anonymous_slots(void **state) {
        valid_config();
        set_ok("pool shared", "members", "a b");
        set_ok("pool shared", "backend", "redis://127.0.0.1:6379");
        set_at(90, "pool shared", "quarantine-exit-codes", "3");
        set_at(91, "pool shared", "quarantine-after", "2");
        set_at(92, "pool grid", "quarantine-exit-codes", "3");
        set_ok("pool anon", "limit", "2");
        set_at(94, "pool anon", "backend", "redis://127.0.0.1:6379");
        set_at(95, "pool anon", "quarantine-exit-codes", "3");
        set_ok("lane check", "pools", "shared grid");
        set_at(93, "lane check", "health", "yes");
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_false(has_error("test.conf:90", NULL, NULL));
        assert_false(has_error("test.conf:91", NULL, NULL));
        assert_has_error("test.conf:92", "quarantine-exit-codes", "pool grid has no members=");
        assert_has_error("test.conf:95", "quarantine-exit-codes", "pool anon has no members=");
        assert_false(has_error("test.conf:93", "health", "shared"));
        assert_has_error("test.conf:93", "health", "pool grid has no members=");
        /* health=also too (the scripts' HEALTH.first(): quarantined members first, else ordinary ones). */
        set_ok("lane check", "pools", "shared");
        set_at(96, "lane check", "health", "also");
        assert_int_equal(conf_validate(c, &errors), -EINVAL); /* grid's and anon's errors above */
        assert_false(has_error("test.conf:96", NULL, NULL));
}

static void test_quarantine_keys_round_trip(void **state) {
        valid_config();
        set_ok("pool rigs", "members", "a b");
        set_ok("pool rigs", "quarantine-exit-codes", "4 3 200");
        set_ok("pool rigs", "quarantine-after", "2");
        set_ok("pool rigs", "admin-users", "alice");
        set_ok("pool rigs", "admin-groups", "lab");
        set_ok("lane check", "pools", "rigs");
        set_ok("lane check", "health", "yes");
        assert_int_equal(conf_validate(c, &errors), 0);
        assert_round_trips(c);
        _cleanup_free_ char *text = dump(c);
        assert_non_null(strstr(text, "quarantine-exit-codes=3 4 200\nquarantine-after=2\n"));
        assert_non_null(strstr(text, "health=yes\n"));
        /* health = also (SPEC §3.6: "unless the lane also lists ordinary use") round-trips as itself. */
        set_ok("lane check", "health", "also");
        assert_int_equal(conf_validate(c, &errors), 0);
        assert_round_trips(c);
        _cleanup_free_ char *also = dump(c);
        assert_non_null(strstr(also, "health=also\n"));
}

static void test_too_many_labels(void **state) {
        char key[32];
        for (int i = 0; i < CONF_LABELS_MAX; i++) {
                snprintf(key, sizeof key, "label.l%d", i);
                set_ok("pool rigs", key, "");
        }
        set_fails("pool rigs", "label.one-more", "", "too many labels");
}

/* ---- also= (SPEC §3.5: several pools at once) ---- */

static void test_lane_also_parses_pools_and_counts(void **state) {
        valid_config();
        set_ok("pool db", "limit", "1");
        set_ok("pool licence", "members", "l1 l2 l3");
        set_ok("lane merge", "also", "db licence:2");
        LaneConfig *l = conf_find_lane(c, "merge");
        assert_int_equal(l->n_also, 2);
        assert_string_equal(l->also[0].pool, "db");
        assert_int_equal(l->also[0].slots, 1);
        assert_string_equal(l->also[1].pool, "licence");
        assert_int_equal(l->also[1].slots, 2);
        assert_int_equal(conf_validate(c, &errors), 0);
        set_ok("lane merge", "also", ""); /* empty: none */
        assert_null(l->also);
        assert_int_equal(l->n_also, 0);
}

static void test_lane_also_bad_input(void **state) {
        set_fails("lane l", "also", "db db", "pool \"db\" is listed twice");
        set_fails("lane l", "also", "db db:2", "listed twice");
        set_fails("lane l", "also", "db:0", "invalid slot count");
        set_fails("lane l", "also", "db:", "invalid slot count");
        set_fails("lane l", "also", "db:-1", "invalid slot count");
        set_fails("lane l", "also", "db:1x", "invalid slot count");
        set_fails("lane l", "also", "db:1000001", "invalid slot count");
        set_fails("lane l", "also", "db:99999999999999999999", "invalid slot count");
        set_fails("lane l", "also", "d/b", "invalid pool name");
        set_fails("lane l", "also", ":2", "invalid pool name");
        set_fails("lane l", "also", "a b c d e f g h i j k l m n o p q", "too many");
}

/* Pool `name` with two slots, kept by the Redis at `url` (a shared pool). */
static void set_shared_pool(const char *name, const char *url) {
        char section[64];
        snprintf(section, sizeof section, "pool %s", name);
        set_ok(section, "limit", "2");
        set_ok(section, "backend", url);
}

/* Lane `name` over `pools`, and its also= as if from line `line` (where validation's error about it points). */
static void set_lane_also_at(unsigned line, const char *name, const char *pools, const char *also) {
        char section[64];
        snprintf(section, sizeof section, "lane %s", name);
        set_ok(section, "pools", pools);
        (void) set_at(line, section, "also", also);
}

static void test_validate_lane_also_names_the_lane(void **state) {
        valid_config();
        set_ok("pool db", "limit", "2");
        set_shared_pool("shared", "redis://127.0.0.1:6379");
        set_shared_pool("shared2", "redis://127.0.0.1:6379");
        set_at(90, "lane merge", "also", "grid");               /* its own pool */
        set_lane_also_at(91, "a", "grid", "nosuch db:3");       /* unknown; K above the limit */
        set_lane_also_at(92, "b", "grid", "shared");            /* a shared pool with a local one */
        set_lane_also_at(93, "c", "shared", "shared2");         /* shared, one backend: a set */
        set_ok("pool a-b", "limit", "1");
        set_ok("pool A_b", "limit", "1");
        set_lane_also_at(94, "d", "grid", "a-b A_b");           /* one SLOT_A_B_* for both */
        set_ok("lane e", "max-in-use", "1");
        set_lane_also_at(95, "e", "grid", "db:2");              /* K above the lane's max-in-use= */
        set_ok("lane f", "max-in-use", "2");
        set_lane_also_at(96, "f", "grid", "db:2");              /* K at it: fine */
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_has_error("test.conf:90", "also", "lane merge names its own pool grid in also=");
        assert_has_error("test.conf:91", "also", "lane a names pool nosuch, which is not defined");
        assert_has_error("test.conf:91", "also", "lane a takes 3 slots of pool db, which has 2");
        assert_has_error("test.conf:92", "also", "lane b mixes shared (backend=) and local pools in one all-or-nothing set (shared is shared, grid local)");
        assert_false(has_error("test.conf:93", "also", ""));
        /* The variables' name as slotctl run spells it: upper-cased, '-' as '_'. */
        assert_has_error("test.conf:94", "also", "lane d names pools a-b and A_b, whose variables would both be SLOT_A_B_*");
        /* The lane's max-in-use= holds in each pool of its set: such a set could never be granted, and would hold
         * back grid's queue for as long as it waits (brokerd.conf(5), also=). */
        assert_has_error("test.conf:95", "also", "lane e takes 2 slots of pool db with every grant, more than its max-in-use=1");
        assert_false(has_error("test.conf:96", NULL, NULL));
}

/* SPEC §3.5, shared pools: a set is all local or all on one backend, which brokerd reaches through one link (one
 * script call decides over the set): another URL, ACL user or password file is another backend, named with the
 * lane and the two pools; and a lane's pools= count as the sets it makes, not only its also=. */
static void test_validate_lane_also_refuses_a_set_over_two_backends(void **state) {
        valid_config();
        set_shared_pool("s1", "redis://127.0.0.1:6379");
        set_shared_pool("s2", "redis://127.0.0.1:6380");
        set_shared_pool("s3", "redis://127.0.0.1:6379");
        set_ok("pool s3", "backend-user", "ci");
        set_shared_pool("s4", "redis://127.0.0.1:6379");
        set_ok("pool s4", "backend-password-file", "/etc/slotbroker/redis.pw");
        set_shared_pool("s5", "redis://127.0.0.1:6379");
        set_lane_also_at(80, "url", "s1", "s2");
        set_lane_also_at(81, "user", "s1", "s3");
        set_lane_also_at(82, "pw", "s1", "s4");
        set_lane_also_at(83, "route", "s1 s2", "s5");           /* its second choice's set is over two backends */
        set_lane_also_at(84, "mixed", "s1 grid", "s5");         /* its second choice's set is mixed */
        set_lane_also_at(85, "one", "s1", "s5");                /* one backend: the rule holds */
        assert_int_equal(conf_validate(c, &errors), -EINVAL);
        assert_has_error("test.conf:80", "also", "lane url takes pools s1 and s2, whose backend= differ: an all-or-nothing set is all local or all on one backend");
        assert_has_error("test.conf:81", "also", "lane user takes pools s1 and s3, whose backend-user= differ");
        assert_has_error("test.conf:82", "also", "lane pw takes pools s1 and s4, whose backend-password-file= differ");
        assert_has_error("test.conf:83", "also", "lane route takes pools s1 and s2, whose backend= differ");
        assert_has_error("test.conf:84", "also", "lane mixed mixes shared (backend=) and local pools in one all-or-nothing set (s1 is shared, grid local)");
        assert_false(has_error("test.conf:85", "also", ""));
}

/* ---- conf_dump ---- */

static void set_every_key(void) {
        set_ok("broker", "socket", "/run/slot/io.slotbroker");
        set_ok("broker", "state-directory", "/var/lib/slot");
        set_ok("broker", "audit", "all");
        set_ok("broker", "lease-persistence", "best-effort");
        set_ok("broker", "history-retention", "90d 12h");
        set_ok("broker", "metrics-textfile", "/var/lib/prom/slot.prom");
        set_ok("broker", "reclaim-grace", "0");
        set_ok("broker", "exit-idle-after", "15min");
        set_ok("broker", "max-connections", "20000");
        set_ok("broker", "max-connections-per-uid", "12000");
        set_ok("broker", "max-waiters-per-uid", "10000");
        set_ok("broker", "max-closing-fds-per-uid", "300");
        set_ok("broker", "max-closing-fds", "3000");
        set_ok("broker", "max-message-size", "65537");
        set_ok("broker", "max-output-per-connection", "2M");
        set_ok("pool grid", "limit", "4");
        set_ok("pool grid", "queue-timeout", "1.5s");
        set_ok("pool grid", "queue-congestion-timeout", "250ms");
        set_ok("pool grid", "max-queue", "0");
        set_ok("pool grid", "backend", "redis://redis:6379/1");
        set_ok("pool rigs", "members", "rig-a rig-b rig-c");
        set_ok("pool rigs", "limit", "3");
        set_ok("pool rigs", "label.arm64", "rig-a rig-b");
        set_ok("pool rigs", "label.usb3", "rig-c");
        set_ok("lane merge", "pools", "grid rigs");
        set_ok("lane merge", "labels", "arm64 !usb3");
        set_ok("lane merge", "policy", "fail-fast");
        set_ok("lane merge", "priority", "-3");
        set_ok("lane merge", "max-in-use", "2");
        set_ok("lane merge", "reserve", "1");
        set_ok("lane merge", "queue-timeout", "infinity");
        set_ok("lane merge", "client-wait", "ignore");
        set_ok("lane merge", "max-hold", "1h 1us");
        set_ok("lane merge", "allow-users", "root 1000");
        set_ok("lane merge", "allow-groups", "ci");
        set_ok("lane nightly", "pools", "rigs");
        set_ok("lane nightly", "queue-timeout", "2h");
        set_ok("pool db", "limit", "2");
        set_ok("lane nightly", "also", "db:2");
}

static void test_dump_of_every_key_reads_back_the_same(void **state) {
        set_every_key();
        assert_int_equal(conf_validate(c, &errors), 0);
        assert_round_trips(c);
}

/* conf_copy() (the simulator builds a reload's configuration on a copy of the one before): every key, and the
 * sources conf_validate() names, are the copy's own: it outlives the original, and validates as it would. */
static void test_copy_is_the_same_configuration(void **state) {
        set_every_key();
        set_ok("pool rigs", "quarantine-exit-codes", "3 4");
        set_ok("pool rigs", "quarantine-after", "2");
        set_ok("pool rigs", "cooldown", "5s");
        set_ok("pool rigs", "admin-users", "ops");
        set_ok("pool rigs", "admin-groups", "wheel");
        set_ok("pool grid", "backend-user", "ci");
        set_ok("pool grid", "backend-password-file", "/etc/slot/pw");
        set_ok("lane health", "pools", "rigs");
        set_ok("lane health", "health", "yes");
        set_at(500, "pool rigs", "limit", "5");                  /* an error naming its line */
        set_at(501, "lane merge", "reserve", "9");
        BrokerConfig *copy = NULL;
        assert_int_equal(conf_copy(c, &copy), 0);
        char *want = dump(c);
        ConfErrors want_errors = {}, got_errors = {};
        assert_int_equal(conf_validate(c, &want_errors), -EINVAL);
        c = conf_free(c);
        char *got = dump(copy);
        assert_string_equal(got, want);
        assert_int_equal(conf_validate(copy, &got_errors), -EINVAL);
        assert_int_equal(got_errors.n_errors, want_errors.n_errors);
        assert_true(want_errors.n_errors >= 2);
        for (size_t i = 0; i < want_errors.n_errors; i++) {
                assert_string_equal(got_errors.errors[i].where ?: "-", want_errors.errors[i].where ?: "-");
                assert_string_equal(got_errors.errors[i].key ?: "-", want_errors.errors[i].key ?: "-");
                assert_string_equal(got_errors.errors[i].message, want_errors.errors[i].message);
        }
        /* And goes on as the original would have. */
        ConfSource src = { .file = (char *) "later.conf", .line = 1 };
        assert_int_equal(conf_set(copy, "pool rigs", "label.arm64", "rig-c", &src, &got_errors), 0);
        assert_int_equal(conf_find_pool(copy, "rigs")->n_labels, 2);
        conf_errors_done(&want_errors);
        conf_errors_done(&got_errors);
        free(want);
        free(got);
        c = copy;
}

static void test_dump_of_a_fresh_config_reads_back_the_same(void **state) {
        assert_round_trips(c);
}

static void test_dump_shows_durations_and_sizes_readably(void **state) {
        valid_config();
        set_ok("broker", "max-message-size", "131072");
        char *d = dump(c);
        assert_non_null(strstr(d, "\nhistory-retention=30d\n"));
        assert_non_null(strstr(d, "\nmax-message-size=128K\n"));
        assert_non_null(strstr(d, "\nmax-output-per-connection=1M\n"));
        assert_non_null(strstr(d, "\n[pool grid]\nlimit=4\nqueue-timeout=5min\n"));
        assert_non_null(strstr(d, "\n[lane merge]\npools=grid\npolicy=fail-fast\n"));
        free(d);
}

/* ---- enums ---- */

static void test_lane_policy_strings_round_trip(void **state) {
        for (LanePolicy p = 0; p < _LANE_POLICY_MAX; p++)
                assert_int_equal(lane_policy_from_string(lane_policy_to_string(p)), p);
        assert_string_equal(lane_policy_to_string(LANE_POLICY_FAIL_FAST), "fail-fast");
        assert_int_equal(lane_policy_from_string("nope"), _LANE_POLICY_INVALID);
        assert_int_equal(lane_policy_from_string(NULL), _LANE_POLICY_INVALID);
        assert_null(lane_policy_to_string(_LANE_POLICY_MAX));
        assert_null(lane_policy_to_string(_LANE_POLICY_INVALID));
}

static void test_audit_level_strings_round_trip(void **state) {
        for (AuditLevel a = 0; a < _AUDIT_LEVEL_MAX; a++)
                assert_int_equal(audit_level_from_string(audit_level_to_string(a)), a);
        assert_string_equal(audit_level_to_string(AUDIT_ALL), "all");
        assert_int_equal(audit_level_from_string("everything"), _AUDIT_LEVEL_INVALID);
        assert_null(audit_level_to_string(_AUDIT_LEVEL_MAX));
}

static void test_null_arguments(void **state) {
        assert_int_equal(conf_new(NULL), -EINVAL);
        assert_null(conf_free(NULL));
        assert_int_equal(conf_set(c, NULL, "a", "b", NULL, NULL), -EINVAL);
        assert_int_equal(conf_set(c, "broker", "audit", NULL, NULL, NULL), -EINVAL);
        assert_int_equal(conf_validate(NULL, NULL), -EINVAL);
        assert_null(conf_find_pool(NULL, "x"));
        assert_null(conf_find_lane(c, NULL));
        conf_errors_done(NULL);
        assert_int_equal(conf_errors_add(NULL, NULL, NULL, "x"), -EINVAL);
}

#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)

int main(void) {
        const struct CMUnitTest tests[] = {
                T(test_new_config_has_documented_broker_defaults),
                T(test_new_pool_has_documented_defaults),
                T(test_new_lane_has_documented_defaults),
                T(test_embedded_default_matches_spec),
                T(test_embedded_default_has_at_least_one_slot),
                T(test_broker_paths_must_be_absolute),
                T(test_broker_socket_path_fits_sockaddr_un),
                T(test_broker_audit_is_decisions_or_all),
                T(test_broker_lease_persistence_is_required_or_best_effort),
                T(test_broker_history_retention_is_a_positive_duration),
                T(test_broker_reclaim_grace_may_be_zero_but_not_infinity),
                T(test_broker_revoke_grace_may_be_zero_but_not_infinity),
                T(test_broker_exit_idle_after),
                T(test_broker_connection_limits_are_strict_integers),
                T(test_broker_acquire_rates),
                T(test_broker_max_waiters_per_uid_may_be_zero),
                T(test_broker_sizes_accept_k_m_g_suffixes),
                T(test_pool_limit_is_a_positive_integer),
                T(test_pool_members_set_limit_to_their_count),
                T(test_pool_members_must_be_valid_distinct_names),
                T(test_member_lists_with_duplicates_or_many_names),
                T(test_pool_limit_and_member_count_must_agree),
                T(test_pool_limit_equal_to_member_count_is_fine),
                T(test_pool_queue_timeout_infinity_means_unset),
                T(test_pool_congestion_timeout_needs_queue_timeout),
                T(test_pool_congestion_timeout_above_queue_timeout_is_an_error),
                T(test_pool_congestion_timeout_up_to_queue_timeout_and_zero_are_fine),
                T(test_pool_max_queue_accepts_zero_and_infinity),
                T(test_pool_backend_accepts_only_redis_urls),
                T(test_pool_min_replicas_needs_a_backend_and_a_short_timeout),
                T(test_pool_cooldown_bounds_and_shared_pools),
                T(test_lane_pools_keep_their_order),
                T(test_lane_pools_must_be_valid_distinct_names),
                T(test_lane_policy_is_fail_fast_or_wait),
                T(test_lane_priority_is_a_signed_int),
                T(test_lane_max_in_use_is_at_least_one),
                T(test_lane_reserve),
                T(test_lane_queue_timeout_infinity_is_a_value),
                T(test_lane_client_wait_is_honor_or_ignore),
                T(test_lane_max_hold),
                T(test_lane_allow_lists_take_names_and_ids),
                T(test_empty_value_resets_every_key_to_its_default),
                T(test_later_assignment_replaces_earlier),
                T(test_unknown_key_is_an_error_listing_known_keys),
                T(test_unknown_section_is_an_error),
                T(test_section_names_are_checked),
                T(test_name_validity),
                T(test_reason_validity),
                T(test_failed_key_leaves_no_trace),
                T(test_surrounding_whitespace_is_ignored),
                T(test_control_characters_are_refused),
                T(test_error_names_file_line_key_and_value),
                T(test_errors_without_source_print_without_where),
                T(test_errors_carry_no_control_characters),
                T(test_long_values_are_cut_in_messages),
                T(test_errors_are_capped),
                T(test_section_add_creates_an_empty_section_at_its_header),
                T(test_too_many_sections_is_an_error),
                T(test_validate_accepts_a_minimal_config),
                T(test_validate_requires_a_lane),
                T(test_validate_lane_needs_a_pool),
                T(test_validate_lane_may_name_only_existing_pools),
                T(test_validate_pool_needs_limit_or_members),
                T(test_validate_reserves_must_fit_the_limit),
                T(test_validate_reserves_equal_to_the_limit_are_fine_when_no_lane_starves),
                T(test_validate_lane_starved_by_other_reserves),
                T(test_validate_reserve_above_max_in_use),
                T(test_validate_catches_bad_values_set_directly),
                T(test_validate_reports_every_problem),
                T(test_pool_labels_name_members),
                T(test_pool_label_names_and_members_must_be_valid),
                T(test_validate_labels_need_members_and_name_known_ones),
                T(test_validate_lane_labels_some_member_can_satisfy),
                T(test_validate_label_unknown_members_in_list_order),
                T(test_validate_lane_labels_against_unordered_members),
                T(test_lane_labels_first_offending_term_is_named),
                T(test_quarantine_exit_codes_are_1_to_255),
                T(test_validate_quarantine_is_taken_on_shared_pools_refused_on_anonymous_slots),
                T(test_quarantine_keys_round_trip),
                T(test_too_many_labels),
                T(test_lane_also_parses_pools_and_counts),
                T(test_lane_also_bad_input),
                T(test_validate_lane_also_names_the_lane),
                T(test_validate_lane_also_refuses_a_set_over_two_backends),
                T(test_dump_of_every_key_reads_back_the_same),
                T(test_copy_is_the_same_configuration),
                T(test_dump_of_a_fresh_config_reads_back_the_same),
                T(test_dump_shows_durations_and_sizes_readably),
                T(test_lane_policy_strings_round_trip),
                T(test_audit_level_strings_round_trip),
                T(test_null_arguments),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
