/* SPDX-License-Identifier: MIT */
/* test-node.c — node_load(): the node id is made once and read back after (a restart is the same node), a
 * damaged id file is moved aside and replaced, the name is node-name= or the hostname; every load makes
 * an incarnation that succeeds the last one only if that process is gone (a copy of a live daemon's state
 * directory claims nothing). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "macro.h"
#include "node.h"

static char dir[64];

static int setup(void **state) {
        snprintf(dir, sizeof dir, "/tmp/test-node-XXXXXX");
        return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
        char cmd[sizeof dir + 16];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        return system(cmd) == 0 ? 0 : -1;
}

static unsigned calls;

static void fill(void *buf, size_t n, void *userdata) {
        calls++;
        memset(buf, *(const uint8_t *) userdata, n);
}

static void test_made_once_then_read(void **state) {
        char sub[128];
        snprintf(sub, sizeof sub, "%s/state/deeper", dir); /* made with its parents */
        uint8_t byte = 0xab;
        Node n;
        calls = 0;
        assert_int_equal(node_load(sub, "runner-1", fill, &byte, &n), 0);
        assert_string_equal(n.id, "abababababababababababababababab");
        assert_string_equal(n.name, "runner-1");
        node_done(&n);

        byte = 0xcd;
        assert_int_equal(node_load(sub, NULL, fill, &byte, &n), 0);
        assert_string_equal(n.id, "abababababababababababababababab"); /* the same node */
        assert_int_equal(calls, 3); /* the id once, an incarnation per load */
        char host[256] = {};
        assert_int_equal(gethostname(host, sizeof host - 1), 0);
        assert_string_equal(n.name, host);
        node_done(&n);
}

static void test_damaged_id_replaced(void **state) {
        char path[128];
        snprintf(path, sizeof path, "%s/" NODE_ID_FILE, dir);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs("not an id\n", f);
        fclose(f);

        uint8_t byte = 0x01;
        Node n;
        assert_int_equal(node_load(dir, "x", fill, &byte, &n), 0);
        assert_string_equal(n.id, "01010101010101010101010101010101");
        node_done(&n);

        /* The damaged file is kept for an operator, beside the new one. */
        unsigned aside = 0;
        DIR *d = opendir(dir);
        assert_non_null(d);
        for (struct dirent *e; (e = readdir(d));)
                aside += strncmp(e->d_name, NODE_ID_FILE ".corrupt", strlen(NODE_ID_FILE ".corrupt")) == 0;
        closedir(d);
        assert_int_equal(aside, 1);
}

static void write_incarnation(const char *line) {
        char path[128];
        snprintf(path, sizeof path, "%s/" NODE_INCARNATION_FILE, dir);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(line, f);
        fclose(f);
}

static long long boot_instant(void) {
        struct timespec rt, bt;
        clock_gettime(CLOCK_REALTIME, &rt);
        clock_gettime(CLOCK_BOOTTIME, &bt);
        long long offset_ns = ((long long) rt.tv_sec - bt.tv_sec) * 1000000000LL + (rt.tv_nsec - bt.tv_nsec);
        return (offset_ns + 500000000LL) / 1000000000LL;
}

/* This boot as node.c records it: "BOOT_ID@SECONDS". */
static void boot_id(char *buf, size_t size) {
        char id[64] = "";
        FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
        assert_non_null(f);
        assert_non_null(fgets(id, (int) sizeof id, f));
        fclose(f);
        id[strcspn(id, "\n")] = 0;
        snprintf(buf, size, "%s@%lld", id, boot_instant());
}

static void test_incarnations_succeed_only_a_process_that_is_gone(void **state) {
        uint8_t byte = 0x11;
        Node n;
        assert_int_equal(node_load(dir, "x", fill, &byte, &n), 0);
        assert_string_equal(n.identity, "1111111111111111/"); /* the first start succeeds nobody */
        node_done(&n);

        /* The same process again (as if it were still running): a copy of a live daemon's directory. */
        byte = 0x22;
        assert_int_equal(node_load(dir, "x", fill, &byte, &n), 0);
        assert_string_equal(n.identity, "2222222222222222/");
        node_done(&n);

        /* Recorded by a process of this boot that is gone (pid 1 with another start time cannot be ours, a
         * pid far above pid_max does not exist): its start and those before it are succeeded. */
        char boot[64], line[512];
        boot_id(boot, sizeof boot);
        snprintf(line, sizeof line, "aaaaaaaaaaaaaaaa %s 1 1 bbbbbbbbbbbbbbbb,cccccccccccccccc\n", boot);
        write_incarnation(line);
        byte = 0x33;
        assert_int_equal(node_load(dir, "x", fill, &byte, &n), 0);
        assert_string_equal(n.identity, "3333333333333333/aaaaaaaaaaaaaaaa,bbbbbbbbbbbbbbbb,cccccccccccccccc");
        node_done(&n);
        /* At most NODE_PREVIOUS_MAX, the newest; a list longer than any this code writes is cut, not overrun. */
        snprintf(line, sizeof line, "aaaaaaaaaaaaaaaa %s 99999999 5 %s\n", boot,
                 "bbbbbbbbbbbbbbbb,cccccccccccccccc,dddddddddddddddd,eeeeeeeeeeeeeeee,ffffffffffffffff,"
                 "0000000000000000,1111111111111111,2222222222222222,3333333333333333");
        write_incarnation(line);
        byte = 0x88;
        assert_int_equal(node_load(dir, "x", fill, &byte, &n), 0);
        assert_string_equal(n.identity, "8888888888888888/aaaaaaaaaaaaaaaa,bbbbbbbbbbbbbbbb,cccccccccccccccc,dddddddddddddddd");
        node_done(&n);
        snprintf(line, sizeof line, "aaaaaaaaaaaaaaaa %s 99999999 5 -\n", boot);
        write_incarnation(line);
        byte = 0x44;
        assert_int_equal(node_load(dir, "x", fill, &byte, &n), 0);
        assert_string_equal(n.identity, "4444444444444444/aaaaaaaaaaaaaaaa");
        node_done(&n);

        /* Where the boot id is hidden (ProcSubset=pid in a drop-in), the boot's instant tells. */
        snprintf(line, sizeof line, "aaaaaaaaaaaaaaaa -@%lld 99999999 5 -\n", boot_instant());
        write_incarnation(line);
        byte = 0x66;
        assert_int_equal(node_load(dir, "x", fill, &byte, &n), 0);
        assert_string_equal(n.identity, "6666666666666666/aaaaaaaaaaaaaaaa");
        node_done(&n);
        snprintf(line, sizeof line, "aaaaaaaaaaaaaaaa -@%lld 99999999 5 -\n", boot_instant() - 3600);
        write_incarnation(line);
        byte = 0x77;
        assert_int_equal(node_load(dir, "x", fill, &byte, &n), 0);
        assert_string_equal(n.identity, "7777777777777777/");
        node_done(&n);

        /* Another boot (a reboot, or an image made on another host): no claim. */
        snprintf(line, sizeof line, "aaaaaaaaaaaaaaaa 00000000-0000-0000-0000-000000000000@%lld 99999999 5 -\n",
                 boot_instant());
        write_incarnation(line);
        byte = 0x55;
        assert_int_equal(node_load(dir, "x", fill, &byte, &n), 0);
        assert_string_equal(n.identity, "5555555555555555/");
        node_done(&n);

        /* Durable before node_load() returns: the file names this start and this process. */
        char path[128], got[256] = "";
        snprintf(path, sizeof path, "%s/" NODE_INCARNATION_FILE, dir);
        FILE *f = fopen(path, "re");
        assert_non_null(f);
        assert_non_null(fgets(got, sizeof got, f));
        fclose(f);
        /* The start time is /proc/self/stat's field 22 (what tells a live predecessor from a reused pid). */
        char stat[1024] = "";
        f = fopen("/proc/self/stat", "re");
        assert_non_null(f);
        assert_non_null(fgets(stat, sizeof stat, f));
        fclose(f);
        const char *p = strrchr(stat, ')') + 2;
        for (int i = 3; i < 22; i++)
                p = strchr(p, ' ') + 1;
        snprintf(line, sizeof line, "5555555555555555 %s %ld %llu -\n", boot, (long) getpid(), strtoull(p, NULL, 10));
        assert_string_equal(got, line);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_made_once_then_read, setup, teardown),
                cmocka_unit_test_setup_teardown(test_damaged_id_replaced, setup, teardown),
                cmocka_unit_test_setup_teardown(test_incarnations_succeed_only_a_process_that_is_gone, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
