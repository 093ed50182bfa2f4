/* SPDX-License-Identifier: MIT */
/* test-handover.c — the state a stopping brokerd hands to systemd's fd store (handover.h): every field
 * survives a round trip; a state cut short at any length, damaged, from another boot or a newer format is
 * refused, never half read; and the load matches sockets to entries by inode, closes (with a shutdown the
 * client sees) those without one, and empties the state so it is never used twice. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "handover.h"
#include "macro.h"
#include "strv.h"

#define BOOT "0123456789abcdef0123456789abcdef"
#define NOW ((usec_t) 5000 * USEC_PER_SEC)

static void *mem_copy(const void *p, size_t n) {
        void *q = malloc(n);
        assert_non_null(q);
        return memcpy(q, p, n);
}

static void fill(Handover *h) {
        HandoverConnection *c;
        assert_int_equal(handover_add_pool(h, "default", 4000 * USEC_PER_SEC), 0);
        assert_int_equal(handover_add_pool(h, "rigs", 1), 0);

        /* A waiter with every field set, and bytes in its buffers that are no UTF-8 (NUL included). */
        assert_int_equal(handover_add_connection(h, &c), 0);
        c->ino = 123456789012345ULL;
        c->dev = 42;
        c->peer_since = 77 * USEC_PER_SEC;
        c->input = mem_copy("{\"method\":\"x\"}\0\xff\xfe", 17);
        c->n_input = 17;
        c->output = mem_copy("\0\x01\x02", 3);
        c->n_output = 3;
        c->has_acquire = true;
        c->acquire = (HandoverAcquire) {
                .lane = strdup("nightly"),
                .job = strdup("build #7"),
                .slots = 2,
                .labels = strv_copy((char *const[]) { "arm64", "!flaky", NULL }),
                .member = strdup("rig-b"),
                .more = true,
                .fence = true,
                .max_hold = 90 * USEC_PER_SEC,
                .max_wait = 30 * USEC_PER_SEC,
                .last_position = 3,
                .last_queued = 9,
                .has_command = true,
                .command_pid = 4242,
                .command_start = 987654321,
                .pool = strdup("rigs"),
                .arrival = 4900 * USEC_PER_SEC,
                .state = QUEUE_STATE_SATURATED,
                .idle = 77,
                .budget = 123 * USEC_PER_SEC,
                .position = 2,
                .remote_id = strdup("node:rid-1"),
                .lane_rules = strdup("also db:1,label arm64"),
        };
        /* A holder. */
        assert_int_equal(handover_add_connection(h, &c), 0);
        c->ino = 7;
        c->has_acquire = true;
        c->acquire = (HandoverAcquire) {
                .lane = strdup("merge"),
                .slots = 1,
                .max_hold = USEC_INFINITY,
                .max_wait = USEC_INFINITY,
                .budget = USEC_INFINITY,
                .lease = strdup("0123456789abcdef0123456789abcdef"),
        };
        /* A connection between calls: empty buffers. */
        assert_int_equal(handover_add_connection(h, &c), 0);
        c->ino = 8;
}

static void format(const Handover *h, char **ret, size_t *ret_size) {
        assert_int_equal(handover_format(h, BOOT, 99, NOW - 1, ret, ret_size), 0);
}

static void test_round_trip(void **state) {
        _cleanup_(handover_done) Handover h = {}, back = {};
        _cleanup_free_ char *text = NULL, *again = NULL;
        size_t size, size_again;

        fill(&h);
        format(&h, &text, &size);
        assert_int_equal(handover_parse(text, size, BOOT, NOW, &back), 0);
        assert_int_equal(back.n_pools, 2);
        assert_string_equal(back.pools[0].name, "default");
        assert_true(back.pools[0].last_fast == 4000 * USEC_PER_SEC);
        assert_int_equal(back.n_connections, 3);

        const HandoverConnection *w = &back.connections[0];
        assert_true(w->ino == 123456789012345ULL && w->dev == 42);
        assert_true(w->peer_since == 77 * USEC_PER_SEC); /* the pid check's bound goes with it */
        assert_true(back.connections[1].peer_since == 0); /* not told: the successor's own */
        assert_int_equal(w->n_input, 17);
        assert_memory_equal(w->input, "{\"method\":\"x\"}\0\xff\xfe", 17);
        assert_int_equal(w->n_output, 3);
        assert_memory_equal(w->output, "\0\x01\x02", 3);
        assert_int_equal(w->fd, -EBADF);
        assert_true(w->has_acquire);
        const HandoverAcquire *a = &w->acquire;
        assert_string_equal(a->lane, "nightly");
        assert_string_equal(a->job, "build #7");
        assert_int_equal(a->slots, 2);
        assert_int_equal(strv_length(a->labels), 2);
        assert_string_equal(a->labels[0], "arm64");
        assert_string_equal(a->labels[1], "!flaky");
        assert_string_equal(a->member, "rig-b");
        assert_true(a->more && a->fence);
        assert_true(a->max_hold == 90 * USEC_PER_SEC && a->max_wait == 30 * USEC_PER_SEC);
        assert_true(a->last_position == 3 && a->last_queued == 9);
        assert_true(a->has_command && a->command_pid == 4242 && a->command_start == 987654321);
        assert_string_equal(a->pool, "rigs");
        assert_true(a->arrival == 4900 * USEC_PER_SEC && a->idle == 77 && a->budget == 123 * USEC_PER_SEC);
        assert_int_equal(a->state, QUEUE_STATE_SATURATED);
        assert_int_equal(a->position, 2);
        assert_string_equal(a->remote_id, "node:rid-1");
        assert_string_equal(a->lane_rules, "also db:1,label arm64");
        assert_null(a->lease);

        const HandoverAcquire *l = &back.connections[1].acquire;
        assert_string_equal(l->lease, "0123456789abcdef0123456789abcdef");
        assert_null(l->pool);
        assert_null(l->job);
        assert_null(l->labels);
        assert_null(l->member);
        assert_true(l->max_hold == USEC_INFINITY && l->max_wait == USEC_INFINITY && l->budget == USEC_INFINITY);
        assert_false(l->has_command);
        assert_false(back.connections[2].has_acquire);
        assert_int_equal(back.connections[2].n_input, 0);

        /* What was read formats to the same bytes. */
        assert_int_equal(handover_format(&back, BOOT, 99, NOW - 1, &again, &size_again), 0);
        assert_int_equal(size, size_again);
        assert_memory_equal(text, again, size);
}

static void test_cut_short(void **state) {
        _cleanup_(handover_done) Handover h = {};
        _cleanup_free_ char *text = NULL;
        size_t size;
        fill(&h);
        format(&h, &text, &size);
        for (size_t n = 0; n < size; n++) {
                Handover back = {};
                assert_int_equal(handover_parse(text, n, BOOT, NOW, &back), -EBADMSG);
                assert_int_equal(back.n_connections, 0);
        }
}

static void test_damaged(void **state) {
        _cleanup_(handover_done) Handover h = {};
        _cleanup_free_ char *text = NULL;
        size_t size;
        fill(&h);
        format(&h, &text, &size);
        /* Every byte flipped in turn: refused, or (a digit for a digit, a letter in a string) a state that is
         * still whole; never a crash or a leak (valgrind and ASan run this). */
        for (size_t i = 0; i < size; i++) {
                Handover back = {};
                char saved = text[i];
                text[i] ^= 0x20;
                int r = handover_parse(text, size, BOOT, NOW, &back);
                assert_true(r == 0 || r == -EBADMSG || r == -EPROTONOSUPPORT || r == -ESTALE);
                handover_done(&back);
                text[i] = saved;
        }
}

static int parse_edited(const char *from, const char *to) {
        _cleanup_(handover_done) Handover h = {}, back = {};
        _cleanup_free_ char *text = NULL;
        size_t size;
        fill(&h);
        format(&h, &text, &size);
        char *p = strstr(text, from);
        assert_non_null(p);
        assert_int_equal(strlen(from), strlen(to));
        memcpy(p, to, strlen(to));
        return handover_parse(text, size, BOOT, NOW, &back);
}

static void test_other_format_or_boot(void **state) {
        /* A newer brokerd's state is a format this one does not know; one of version 1 (no lane rules) is read. */
        assert_int_equal(parse_edited("\"version\":2", "\"version\":3"), -EPROTONOSUPPORT);
        assert_int_equal(parse_edited("\"version\":2", "\"version\":0"), -EPROTONOSUPPORT);
        assert_int_equal(parse_edited("\"version\":2", "\"version\":1"), 0);
        assert_int_equal(parse_edited("slotbroker-handover", "slotbroker-handovex"), -EPROTONOSUPPORT);
        assert_int_equal(parse_edited(BOOT, "fedcba9876543210fedcba9876543210"), -ESTALE);
        assert_int_equal(parse_edited(BOOT, "0123456789ABCDEF0123456789abcdef"), -EBADMSG);
        /* Out of range: a state from the future, an arrival after it was written, a bad queue state. */
        assert_int_equal(parse_edited("\"state\":\"saturated\"", "\"state\":\"saturatex\""), -EBADMSG);
        assert_int_equal(parse_edited("\"slots\":2", "\"slots\":0"), -EBADMSG);
        assert_int_equal(parse_edited("\"pid\":4242", "\"pid\":-424"), -EBADMSG);
        assert_int_equal(parse_edited("\"input\":\"", "\"input\":1"), -EBADMSG);
        /* A selector that is none: a label that is no label name, a member that is no name. */
        assert_int_equal(parse_edited("\"!flaky\"", "\"!Flaky\""), -EBADMSG);
        assert_int_equal(parse_edited("\"rig-b\"", "\"rig/b\""), -EBADMSG);

        _cleanup_(handover_done) Handover h = {}, back = {};
        _cleanup_free_ char *text = NULL;
        size_t size;
        fill(&h);
        assert_int_equal(handover_format(&h, BOOT, 99, NOW + 1, &text, &size), 0);
        assert_int_equal(handover_parse(text, size, BOOT, NOW, &back), -ESTALE);
        assert_int_equal(handover_parse("[]", 2, BOOT, NOW, &back), -EBADMSG);
        assert_int_equal(handover_parse("{}", 2, BOOT, NOW, &back), -EBADMSG);
}

static int memfd_with(const char *text, size_t size) {
        int fd = memfd_create("test-handover", MFD_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, text, size), (ssize_t) size);
        return fd;
}

static bool peer_sees_end(int fd) {
        char c;
        return recv(fd, &c, 1, MSG_DONTWAIT) == 0;
}

static void test_load_matches_by_inode(void **state) {
        int a[2], b[2], c[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a), 0);
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, b), 0);
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, c), 0);

        /* A state naming a[0] and c[0] (and one socket that does not come back); b[0] comes without entry. */
        _cleanup_(handover_done) Handover h = {}, got = {};
        HandoverConnection *e;
        struct stat st;
        int named[] = { a[0], c[0] };
        for (size_t i = 0; i < ELEMENTSOF(named); i++) {
                assert_int_equal(handover_add_connection(&h, &e), 0);
                assert_int_equal(fstat(named[i], &st), 0);
                e->ino = st.st_ino;
                e->dev = st.st_dev;
        }
        assert_int_equal(handover_add_connection(&h, &e), 0);
        e->ino = 1;
        char boot[33];
        assert_int_equal(handover_boot_id(boot), 0);
        _cleanup_free_ char *text = NULL;
        size_t size;
        assert_int_equal(handover_format(&h, boot, 1, now_monotonic(), &text, &size), 0);

        int state_fd = memfd_with(text, size);
        int state_copy = dup(state_fd); /* the store's copy */
        HandoverFds f = {};
        assert_false(handover_fds_take(&f, "varlink", 100));
        assert_true(handover_fds_take(&f, HANDOVER_FDNAME_STATE, state_fd));
        assert_true(handover_fds_take(&f, HANDOVER_FDNAME_CONNECTION, c[0]));
        assert_true(handover_fds_take(&f, HANDOVER_FDNAME_CONNECTION, b[0]));
        assert_true(handover_fds_take(&f, HANDOVER_FDNAME_CONNECTION, a[0]));
        HandoverLoad load;
        assert_int_equal(handover_load(&f, now_monotonic(), &got, &load), 0);
        assert_int_equal(load.error, 0);
        assert_int_equal(load.matched, 2);
        assert_int_equal(load.closed, 1);
        assert_int_equal(got.n_connections, 2);
        for (size_t i = 0; i < got.n_connections; i++) {
                assert_int_equal(fstat(got.connections[i].fd, &st), 0);
                assert_true(st.st_ino == got.connections[i].ino);
        }
        assert_true(peer_sees_end(b[1]));
        assert_false(peer_sees_end(a[1]));
        assert_false(peer_sees_end(c[1]));
        /* Read once: the state is empty now, for the store's copy too. */
        assert_int_equal(fstat(state_copy, &st), 0);
        assert_int_equal(st.st_size, 0);
        assert_int_equal(f.n_connections + f.n_states, 0);

        safe_close(state_copy);
        handover_done(&got);
        assert_true(peer_sees_end(a[1])); /* its last copy closed */
        safe_close(a[1]);
        safe_close(b[1]);
        safe_close(c[1]);
}

static void test_load_without_state(void **state) {
        int a[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a), 0);
        HandoverFds f = {};
        assert_true(handover_fds_take(&f, HANDOVER_FDNAME_CONNECTION, a[0]));
        _cleanup_(handover_done) Handover got = {};
        HandoverLoad load;
        assert_int_equal(handover_load(&f, now_monotonic(), &got, &load), 0);
        assert_int_equal(load.error, -ENODATA);
        assert_int_equal(load.closed, 1);
        assert_int_equal(got.n_connections, 0);
        assert_true(peer_sees_end(a[1]));
        safe_close(a[1]);
}

static void test_load_damaged_state(void **state) {
        int a[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, a), 0);
        HandoverFds f = {};
        assert_true(handover_fds_take(&f, HANDOVER_FDNAME_STATE, memfd_with("{\"format\":", 10)));
        assert_true(handover_fds_take(&f, HANDOVER_FDNAME_CONNECTION, a[0]));
        _cleanup_(handover_done) Handover got = {};
        HandoverLoad load;
        assert_int_equal(handover_load(&f, now_monotonic(), &got, &load), 0);
        assert_int_equal(load.error, -EBADMSG);
        assert_int_equal(load.closed, 1);
        assert_true(peer_sees_end(a[1]));
        safe_close(a[1]);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_round_trip),
                cmocka_unit_test(test_cut_short),
                cmocka_unit_test(test_damaged),
                cmocka_unit_test(test_other_format_or_boot),
                cmocka_unit_test(test_load_matches_by_inode),
                cmocka_unit_test(test_load_without_state),
                cmocka_unit_test(test_load_damaged_state),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
