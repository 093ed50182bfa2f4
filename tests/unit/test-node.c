/* SPDX-License-Identifier: MIT */
/* test-node.c — node_load(): the node id is made once and read back after (a restart is the same node), a
 * damaged id file is moved aside and replaced, the name is node-name= or the hostname. */
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
        assert_int_equal(calls, 1);
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

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_made_once_then_read, setup, teardown),
                cmocka_unit_test_setup_teardown(test_damaged_id_replaced, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
