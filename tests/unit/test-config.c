/* SPDX-License-Identifier: MIT */
/* test-config.c — brokerd's configuration files: main file and drop-ins in order, the embedded default,
 * what the INI reader refuses, and errors that name file:line and key, all of them. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "brokerd/config-files.h"

static char dir[64];
static char main_path[128];
static char dropin_dir[128];
static BrokerConfig *c;
static ConfErrors errors;

static int setup(void **state) {
        snprintf(dir, sizeof dir, "/tmp/test-config.XXXXXX");
        if (!mkdtemp(dir))
                return -1;
        snprintf(main_path, sizeof main_path, "%s/brokerd.conf", dir);
        snprintf(dropin_dir, sizeof dropin_dir, "%s/brokerd.conf.d", dir);
        errors = (ConfErrors) {};
        c = NULL;
        return 0;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        return remove(path);
}

static int teardown(void **state) {
        c = conf_free(c);
        conf_errors_done(&errors);
        return nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void write_file(const char *path, const char *text) {
        FILE *f = fopen(path, "we");
        assert_non_null(f);
        assert_int_equal(fputs(text, f) >= 0, 1);
        assert_int_equal(fclose(f), 0);
}

static void write_main(const char *text) {
        write_file(main_path, text);
}

static void write_dropin(const char *name, const char *text) {
        char path[256];
        (void) mkdir(dropin_dir, 0755);
        snprintf(path, sizeof path, "%s/%s", dropin_dir, name);
        write_file(path, text);
}

static int load(void) {
        return config_load_full(main_path, dropin_dir, 0, 3, &c, &errors);
}

static void print_errors(void) {
        for (size_t i = 0; i < errors.n_errors; i++)
                print_message("# error: %s: %s: %s\n", errors.errors[i].where ?: "-", errors.errors[i].key ?: "-",
                              errors.errors[i].message);
}

static void load_ok(void) {
        int r = load();
        if (r != 0) {
                print_errors();
                fail_msg("config_load_full() = %d", r);
        }
        assert_non_null(c);
        assert_int_equal(errors.n_errors, 0);
}

static void assert_has_error(const char *where, const char *key, const char *needle) {
        for (size_t i = 0; i < errors.n_errors; i++) {
                const ConfError *e = errors.errors + i;
                if ((!where || streq_ptr(e->where, where)) && (!key || streq_ptr(e->key, key)) &&
                    (!needle || strstr(e->message, needle)))
                        return;
        }
        print_errors();
        fail_msg("no error at %s for key %s containing \"%s\"", where ?: "*", key ?: "*", needle ?: "*");
}

static char *path_in(const char *base, const char *name, unsigned line) {
        static char buf[4][256];
        static unsigned k;
        char *b = buf[k++ % 4];
        if (line > 0)
                snprintf(b, sizeof buf[0], "%s/%s:%u", base, name, line);
        else
                snprintf(b, sizeof buf[0], "%s/%s", base, name);
        return b;
}

#define MINIMAL "[pool grid]\nlimit=2\n[lane ci]\npools=grid\n"

/* ---- which files, in which order ---- */

static void test_main_file_is_loaded(void **state) {
        write_main("[broker]\naudit=all\n" MINIMAL);
        load_ok();
        assert_int_equal(c->audit, AUDIT_ALL);
        assert_int_equal(conf_find_pool(c, "grid")->limit, 2);
        assert_null(conf_find_lane(c, "merge")); /* no embedded default mixed in */
}

static void test_dropins_apply_in_lexical_order_and_later_wins(void **state) {
        write_main(MINIMAL "[pool grid]\nqueue-timeout=1min\n");
        write_dropin("50-b.conf", "[pool grid]\nlimit=5\n");
        write_dropin("10-a.conf", "[pool grid]\nlimit=3\nmax-queue=7\n");
        write_dropin("9-z.conf", "[pool grid]\nlimit=9\n"); /* "9-z" sorts after "50-b" */
        load_ok();
        PoolConfig *p = conf_find_pool(c, "grid");
        assert_int_equal(p->limit, 9);
        assert_int_equal(p->max_queue, 7);
        assert_true(p->queue_timeout == USEC_PER_MINUTE);
}

static void test_dropins_skip_other_names(void **state) {
        write_main(MINIMAL);
        write_dropin(".hidden.conf", "[pool grid]\nlimit=100\n");
        write_dropin("x.conf.bak", "[pool grid]\nlimit=101\n");
        write_dropin("x.conf~", "[pool grid]\nlimit=102\n");
        write_dropin("README", "not a config\n");
        write_dropin(".conf", "[pool grid]\nlimit=103\n");
        load_ok();
        assert_int_equal(conf_find_pool(c, "grid")->limit, 2);
}

static void test_dropins_alone_replace_the_embedded_default(void **state) {
        write_dropin("10-pools.conf", "[pool gpu]\nlimit=1\n");
        write_dropin("20-lanes.conf", "[lane train]\npools=gpu\n");
        load_ok();
        assert_int_equal(c->n_pools, 1);
        assert_non_null(conf_find_lane(c, "train"));
        assert_null(conf_find_pool(c, "default"));
}

static void test_dropins_alone_do_not_inherit_the_default_pools(void **state) {
        write_dropin("10.conf", "[lane extra]\npools=default\n");
        assert_int_equal(load(), -EINVAL);
        assert_has_error(path_in(dropin_dir, "10.conf", 2), "pools", "names pool default, which is not defined");
        assert_null(c);
}

static void test_no_files_give_the_embedded_default(void **state) {
        load_ok();
        PoolConfig *p = conf_find_pool(c, "default");
        assert_non_null(p);
        assert_int_equal(p->limit, 3);
        assert_true(p->queue_timeout == 5 * USEC_PER_MINUTE);
        assert_int_equal(conf_find_lane(c, "merge")->policy, LANE_POLICY_FAIL_FAST);
        assert_int_equal(conf_find_lane(c, "nightly")->policy, LANE_POLICY_WAIT);
}

static void test_embedded_default_is_sized_to_online_cpus(void **state) {
        assert_int_equal(config_load_full(main_path, dropin_dir, 0, 0, &c, &errors), 0);
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        assert_int_equal(conf_find_pool(c, "default")->limit, n > 0 ? n : 1);
}

static void test_empty_dropin_dir_gives_the_embedded_default(void **state) {
        assert_int_equal(mkdir(dropin_dir, 0755), 0);
        load_ok();
        assert_non_null(conf_find_pool(c, "default"));
}

static void test_explicit_missing_path_is_an_error(void **state) {
        assert_int_equal(config_load_full(main_path, dropin_dir, CONFIG_MAIN_REQUIRED, 3, &c, &errors), -EINVAL);
        assert_null(c);
        assert_int_equal(errors.n_errors, 1);
        assert_has_error(main_path, NULL, "cannot open: No such file or directory");
}

static void test_config_load_takes_dropins_from_path_dot_d(void **state) {
        write_main(MINIMAL);
        write_dropin("1.conf", "[pool grid]\nlimit=4\n");
        assert_int_equal(config_load(main_path, &c, &errors), 0);
        assert_int_equal(conf_find_pool(c, "grid")->limit, 4);
}

static void test_config_load_with_explicit_missing_path_fails(void **state) {
        assert_int_equal(config_load(main_path, &c, &errors), -EINVAL);
        assert_null(c);
        assert_has_error(main_path, NULL, "cannot open");
}

/* ---- errors ---- */

static void test_errors_name_file_line_and_key(void **state) {
        write_main(MINIMAL);
        write_dropin("20-x.conf", "# tune the grid\n[pool grid]\n\nqueue-timeout = 5 minutes please\n");
        assert_int_equal(load(), -EINVAL);
        assert_int_equal(errors.n_errors, 1);
        assert_string_equal(errors.errors[0].where, path_in(dropin_dir, "20-x.conf", 4));
        assert_string_equal(errors.errors[0].key, "queue-timeout");
        assert_non_null(strstr(errors.errors[0].message, "invalid duration \"5 minutes please\""));
}

static void test_every_error_of_every_file_is_reported(void **state) {
        write_main("[pool grid]\nlimit=two\nmax-queue=-1\n[lane ci]\npools=grid gpu\n[lane ci]\npolicy=sometimes\n");
        write_dropin("10.conf", "[broker]\naudit=loud\nfrobnicate=yes\n");
        write_dropin("20.conf", "[pool rigs]\nmembers=a b\nlimit=3\n");
        assert_int_equal(load(), -EINVAL);
        assert_null(c);
        assert_has_error(path_in(dir, "brokerd.conf", 2), "limit", "invalid number \"two\"");
        assert_has_error(path_in(dir, "brokerd.conf", 3), "max-queue", "invalid number \"-1\"");
        assert_has_error(path_in(dir, "brokerd.conf", 7), "policy", "\"sometimes\"");
        assert_has_error(path_in(dropin_dir, "10.conf", 2), "audit", "\"loud\"");
        assert_has_error(path_in(dropin_dir, "10.conf", 3), "frobnicate", "unknown key");
        /* and the cross-checks, after every file was read */
        assert_has_error(path_in(dir, "brokerd.conf", 5), "pools", "names pool gpu");
        assert_has_error(path_in(dropin_dir, "20.conf", 3), "limit", "limit=3 but 2 members");
        assert_has_error(path_in(dir, "brokerd.conf", 1), "limit", "pool grid has no slots");
        assert_int_equal(errors.n_errors, 8);
}

static void test_failure_leaves_ret_untouched(void **state) {
        BrokerConfig *sentinel = (BrokerConfig *) 0x1;
        write_main("[pool grid]\nlimit=0\n");
        assert_int_equal(config_load_full(main_path, dropin_dir, 0, 3, &sentinel, &errors), -EINVAL);
        assert_ptr_equal(sentinel, (BrokerConfig *) 0x1);
}

static void test_oversize_file_is_rejected(void **state) {
        char *big = malloc(CONFIG_FILE_SIZE_MAX + 2);
        assert_non_null(big);
        memset(big, '#', CONFIG_FILE_SIZE_MAX + 1);
        big[CONFIG_FILE_SIZE_MAX + 1] = '\0';
        write_main(big);
        free(big);
        assert_int_equal(load(), -EINVAL);
        assert_has_error(main_path, NULL, "larger than");
        assert_int_equal(errors.n_errors, 1);
}

static void test_file_at_the_size_cap_is_fine(void **state) {
        char *big = malloc(CONFIG_FILE_SIZE_MAX + 1);
        assert_non_null(big);
        memset(big, '\n', CONFIG_FILE_SIZE_MAX);
        memcpy(big, MINIMAL, strlen(MINIMAL));
        big[CONFIG_FILE_SIZE_MAX] = '\0';
        write_main(big);
        free(big);
        load_ok();
}

static void test_nul_byte_is_rejected_with_its_line(void **state) {
        int fd = open(main_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, "[broker]\naudit=all\nx\0y\n", 23), 23);
        close(fd);
        assert_int_equal(load(), -EINVAL);
        assert_has_error(path_in(dir, "brokerd.conf", 3), NULL, "NUL byte");
}

/* A file refused whole (not text) is one error: what follows from ignoring it ("no lane is configured", when the
 * lanes are in that very file) would send an operator after the wrong problem. */
static void test_nul_byte_is_the_only_error(void **state) {
        static const char text[] = MINIMAL "# pasted from a binary: \0\n";
        int fd = open(main_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, text, sizeof text - 1), (ssize_t) sizeof text - 1);
        close(fd);
        assert_int_equal(load(), -EINVAL);
        assert_has_error(path_in(dir, "brokerd.conf", 5), NULL, "NUL byte");
        if (errors.n_errors != 1)
                print_errors();
        assert_int_equal(errors.n_errors, 1);
}

static void test_load_buffer_with_nul_is_the_only_error(void **state) {
        static const char data[] = MINIMAL "\0";
        assert_int_equal(config_load_buffer(data, sizeof data - 1, "buf", &c, &errors), -EINVAL);
        assert_has_error("buf:5", NULL, "NUL byte");
        assert_int_equal(errors.n_errors, 1);
}

static void test_directory_as_config_file_is_rejected(void **state) {
        assert_int_equal(mkdir(main_path, 0755), 0);
        assert_int_equal(load(), -EINVAL);
        assert_has_error(main_path, NULL, "is a directory");
        assert_int_equal(errors.n_errors, 1);
}

static void test_fifo_is_rejected_without_hanging(void **state) {
        assert_int_equal(mkfifo(main_path, 0644), 0);
        assert_int_equal(load(), -EINVAL);
        assert_has_error(main_path, NULL, "not a regular file");
}

static bool unreadable_file_fails(void) {
        ConfErrors e = {};
        BrokerConfig *n = NULL;
        bool ok = false;

        int r = config_load_full(main_path, dropin_dir, 0, 3, &n, &e);
        for (size_t i = 0; r == -EINVAL && !n && i < e.n_errors; i++)
                ok = ok || (streq_ptr(e.errors[i].where, main_path) && strstr(e.errors[i].message, "Permission denied"));
        conf_errors_done(&e);
        conf_free(n);
        return ok;
}

static void test_unreadable_file_is_an_error_not_the_default(void **state) {
        int status;

        write_main(MINIMAL);
        assert_int_equal(chmod(main_path, 0), 0);
        if (geteuid() != 0) {
                assert_true(unreadable_file_fails());
                return;
        }
        /* root reads anything: try as nobody, in a child so that this process keeps its rights */
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
                if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
                        _exit(2);
                _exit(unreadable_file_fails() ? 0 : 1);
        }
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_dropin_linked_to_dev_null_is_empty(void **state) {
        char path[256];
        write_main(MINIMAL);
        assert_int_equal(mkdir(dropin_dir, 0755), 0);
        snprintf(path, sizeof path, "%s/masked.conf", dropin_dir);
        assert_int_equal(symlink("/dev/null", path), 0);
        load_ok();
}

static void test_dangling_dropin_is_an_error(void **state) {
        char path[256];
        write_main(MINIMAL);
        assert_int_equal(mkdir(dropin_dir, 0755), 0);
        snprintf(path, sizeof path, "%s/gone.conf", dropin_dir);
        assert_int_equal(symlink("/nonexistent/x.conf", path), 0);
        assert_int_equal(load(), -EINVAL);
        assert_has_error(path, NULL, "cannot open");
}

static void test_bad_dropin_dir_is_an_error_and_the_main_file_is_still_checked(void **state) {
        write_main(MINIMAL "[broker]\naudit=loud\n");
        write_file(dropin_dir, "a file, not a directory\n");
        assert_int_equal(load(), -EINVAL);
        assert_has_error(dropin_dir, NULL, "cannot open drop-in directory");
        assert_has_error(path_in(dir, "brokerd.conf", 6), "audit", "\"loud\"");
}

/* ---- the INI dialect ---- */

static void test_comments_blank_lines_and_inline_comments(void **state) {
        write_main("# a comment\n; another\n\n[pool grid] ; the browser grid\nlimit = 2 ; sessions\n"
                   "[lane ci] # lanes\npools=grid\n");
        load_ok();
        assert_int_equal(conf_find_pool(c, "grid")->limit, 2);
}

static void test_indented_lines_are_ordinary_lines(void **state) {
        /* inih would take an indented line as a continuation of the previous value. */
        write_main("[pool grid]\n  limit = 2\n    max-queue = 3\n[lane ci]\n\tpools = grid\n");
        load_ok();
        assert_int_equal(conf_find_pool(c, "grid")->limit, 2);
        assert_int_equal(conf_find_pool(c, "grid")->max_queue, 3);
}

static void test_crlf_and_bom_and_missing_final_newline(void **state) {
        write_main("\xef\xbb\xbf[pool grid]\r\nlimit=2\r\n[lane ci]\r\npools=grid");
        load_ok();
        assert_int_equal(conf_find_lane(c, "ci")->n_pools, 1);
}

static void test_line_without_equals_is_an_error(void **state) {
        write_main(MINIMAL "limit 3\n");
        assert_int_equal(load(), -EINVAL);
        assert_has_error(path_in(dir, "brokerd.conf", 5), NULL, "expected KEY=VALUE");
}

static void test_colon_is_not_a_separator(void **state) {
        write_main(MINIMAL "[pool grid]\nlimit: 3\nmax:queue=4\n");
        assert_int_equal(load(), -EINVAL);
        assert_has_error(path_in(dir, "brokerd.conf", 6), NULL, "expected KEY=VALUE");
        assert_has_error(path_in(dir, "brokerd.conf", 7), NULL, "invalid key \"max:queue\"");
}

static void test_missing_key_is_an_error(void **state) {
        write_main(MINIMAL "= 3\n");
        assert_int_equal(load(), -EINVAL);
        assert_has_error(path_in(dir, "brokerd.conf", 5), NULL, "missing key");
}

static void test_bad_section_headers_are_errors(void **state) {
        write_main(MINIMAL "[pool x\nlimit=1\n[pool y] z\nlimit=1\n[]\nlimit=1\n");
        assert_int_equal(load(), -EINVAL);
        assert_has_error(path_in(dir, "brokerd.conf", 5), NULL, "without ]");
        assert_has_error(path_in(dir, "brokerd.conf", 7), NULL, "unexpected text after");
        assert_has_error(path_in(dir, "brokerd.conf", 9), NULL, "unknown section []");
        /* their keys are skipped, not added to [lane ci] above them */
        assert_int_equal(errors.n_errors, 3);
}

static void test_keys_of_an_unknown_section_are_not_reported_again(void **state) {
        write_main(MINIMAL "[server]\nport=1\nhost=x\nuser=y\n");
        assert_int_equal(load(), -EINVAL);
        assert_int_equal(errors.n_errors, 1);
        assert_has_error(path_in(dir, "brokerd.conf", 5), NULL, "unknown section [server]");
}

static void test_key_before_any_section_is_an_error(void **state) {
        write_main("audit=all\n" MINIMAL);
        assert_int_equal(load(), -EINVAL);
        assert_has_error(path_in(dir, "brokerd.conf", 1), "audit", "outside of any section");
}

static void test_long_section_names_are_kept_whole(void **state) {
        /* inih cuts section names at 49 bytes; a 64-byte pool name must survive. */
        char text[512], name[65];
        memset(name, 'p', 64);
        name[64] = '\0';
        snprintf(text, sizeof text, "[pool %s]\nlimit=1\n[lane ci]\npools=%s\n", name, name);
        write_main(text);
        load_ok();
        assert_non_null(conf_find_pool(c, name));
}

static void test_long_lines_up_to_the_cap_are_read(void **state) {
        size_t n = 6000;
        char *text = malloc(n * 8 + 100);
        strcpy(text, MINIMAL "allow-users=");
        for (size_t i = 0; i < n; i++)
                sprintf(text + strlen(text), "u%zu ", i);
        strcat(text, "\n");
        write_main(text);
        free(text);
        load_ok();
        LaneConfig *l = conf_find_lane(c, "ci");
        assert_string_equal(l->allow_users[n - 1], "u5999");
        assert_null(l->allow_users[n]);
}

static void test_lines_beyond_the_cap_are_errors(void **state) {
        char *text = malloc(CONFIG_LINE_MAX + 100);
        strcpy(text, MINIMAL "allow-users=");
        size_t k = strlen(text);
        memset(text + k, 'a', CONFIG_LINE_MAX);
        strcpy(text + k + CONFIG_LINE_MAX, "\n");
        write_main(text);
        free(text);
        assert_int_equal(load(), -EINVAL);
        assert_has_error(path_in(dir, "brokerd.conf", 5), NULL, "longer than");
}

static void test_empty_value_in_a_dropin_resets_the_main_files_value(void **state) {
        write_main(MINIMAL "[pool grid]\nmax-queue=5\nqueue-timeout=1min\n");
        write_dropin("reset.conf", "[pool grid]\nmax-queue=\nqueue-timeout =\n");
        load_ok();
        assert_int_equal(conf_find_pool(c, "grid")->max_queue, -1);
        assert_false(conf_find_pool(c, "grid")->queue_timeout_set);
}

static void test_inih_options_are_left_as_found(void **state) {
        int max_line = ini_max_line;
        bool use_stack = ini_use_stack;
        write_main(MINIMAL);
        load_ok();
        assert_int_equal(ini_max_line, max_line);
        assert_int_equal(ini_use_stack, use_stack);
}

/* ---- strings ---- */

static void test_load_string_validates(void **state) {
        assert_int_equal(config_load_string("[pool grid]\nlimit=2\n", "inline", &c, &errors), -EINVAL);
        assert_null(c);
        assert_has_error(NULL, NULL, "no lane is configured");
        conf_errors_done(&errors);
        assert_int_equal(config_load_string(MINIMAL, "inline", &c, &errors), 0);
        assert_non_null(c);
}

static void test_load_string_names_its_source(void **state) {
        assert_int_equal(config_load_string(MINIMAL "[broker]\naudit=x\n", "scenario.ini", &c, &errors), -EINVAL);
        assert_has_error("scenario.ini:6", "audit", NULL);
}

static void test_load_buffer_refuses_nul(void **state) {
        static const char data[] = "[broker]\n\0audit=all\n";
        assert_int_equal(config_load_buffer(data, sizeof data - 1, "buf", &c, &errors), -EINVAL);
        assert_has_error("buf:2", NULL, "NUL byte");
}

static void test_errors_are_detected_without_an_error_list(void **state) {
        static const char *const bad[] = {
                "[pool grid]\nlimit=zero\n", "[pool grid\n", "[pool grid] x\n", "[nope]\n", "x\n", "=1\n",
                "a b=1\n", "[pool grid]\nfrobnicate=1\n", "limit=1\n",
        };

        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                BrokerConfig *n = NULL;
                assert_int_equal(conf_new(&n), 0);
                if (config_parse_buffer(n, bad[i], strlen(bad[i]), "t", NULL) != -EINVAL)
                        fail_msg("\"%s\" was accepted without an error list", bad[i]);
                conf_free(n);
                assert_int_equal(config_load_string(bad[i], "t", &c, NULL), -EINVAL);
                assert_null(c);
        }
        assert_int_equal(config_load_string(MINIMAL, "t", &c, NULL), 0);
}

static void test_empty_string_is_not_a_config(void **state) {
        assert_int_equal(config_load_string("", "empty", &c, &errors), -EINVAL);
        assert_has_error(NULL, NULL, "no lane is configured");
}

static void test_dump_of_a_loaded_config_loads_back_the_same(void **state) {
        char *a = NULL, *b = NULL;
        size_t size;
        BrokerConfig *again = NULL;

        write_main("[broker]\naudit=all\nmax-message-size=128K\nhistory-retention=1w\n"
                   "[pool grid]\nlimit=4\nqueue-timeout=5m\nqueue-congestion-timeout=20s\nmax-queue=100\n"
                   "[pool rigs]\nmembers=rig-a rig-b\nbackend=redis://r:6379/0\n"
                   "[lane merge]\npools=grid rigs\npolicy=fail-fast\nreserve=1\nallow-groups=ci 1001\n"
                   "[lane nightly]\npools=grid\npriority=-1\nqueue-timeout=infinity\nmax-hold=8h\nclient-wait=ignore\n");
        load_ok();
        FILE *f = open_memstream(&a, &size);
        conf_dump(c, f);
        fclose(f);
        assert_int_equal(config_load_string(a, "dump", &again, &errors), 0);
        f = open_memstream(&b, &size);
        conf_dump(again, f);
        fclose(f);
        assert_string_equal(a, b);
        free(a);
        free(b);
        conf_free(again);
}

#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)

int main(void) {
        const struct CMUnitTest tests[] = {
                T(test_main_file_is_loaded),
                T(test_dropins_apply_in_lexical_order_and_later_wins),
                T(test_dropins_skip_other_names),
                T(test_dropins_alone_replace_the_embedded_default),
                T(test_dropins_alone_do_not_inherit_the_default_pools),
                T(test_no_files_give_the_embedded_default),
                T(test_embedded_default_is_sized_to_online_cpus),
                T(test_empty_dropin_dir_gives_the_embedded_default),
                T(test_explicit_missing_path_is_an_error),
                T(test_config_load_takes_dropins_from_path_dot_d),
                T(test_config_load_with_explicit_missing_path_fails),
                T(test_errors_name_file_line_and_key),
                T(test_every_error_of_every_file_is_reported),
                T(test_failure_leaves_ret_untouched),
                T(test_oversize_file_is_rejected),
                T(test_file_at_the_size_cap_is_fine),
                T(test_nul_byte_is_rejected_with_its_line),
                T(test_nul_byte_is_the_only_error),
                T(test_load_buffer_with_nul_is_the_only_error),
                T(test_directory_as_config_file_is_rejected),
                T(test_fifo_is_rejected_without_hanging),
                T(test_unreadable_file_is_an_error_not_the_default),
                T(test_dropin_linked_to_dev_null_is_empty),
                T(test_dangling_dropin_is_an_error),
                T(test_bad_dropin_dir_is_an_error_and_the_main_file_is_still_checked),
                T(test_comments_blank_lines_and_inline_comments),
                T(test_indented_lines_are_ordinary_lines),
                T(test_crlf_and_bom_and_missing_final_newline),
                T(test_line_without_equals_is_an_error),
                T(test_colon_is_not_a_separator),
                T(test_missing_key_is_an_error),
                T(test_bad_section_headers_are_errors),
                T(test_keys_of_an_unknown_section_are_not_reported_again),
                T(test_key_before_any_section_is_an_error),
                T(test_long_section_names_are_kept_whole),
                T(test_long_lines_up_to_the_cap_are_read),
                T(test_lines_beyond_the_cap_are_errors),
                T(test_empty_value_in_a_dropin_resets_the_main_files_value),
                T(test_inih_options_are_left_as_found),
                T(test_load_string_validates),
                T(test_load_string_names_its_source),
                T(test_load_buffer_refuses_nul),
                T(test_errors_are_detected_without_an_error_list),
                T(test_empty_string_is_not_a_config),
                T(test_dump_of_a_loaded_config_loads_back_the_same),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
