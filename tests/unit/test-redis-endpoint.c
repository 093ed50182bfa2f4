/* SPDX-License-Identifier: MIT */
/* test-redis-endpoint.c — the backend= URL forms (redis-endpoint.h): what each part becomes, the defaults,
 * and the inputs refused. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "redis-endpoint.h"

static void test_tcp_url_gives_host_port_and_db(void **state) {
        RedisEndpoint e;

        assert_int_equal(redis_endpoint_parse("redis://redis.ci.example:6380/3", &e), 0);
        assert_int_equal(e.type, REDIS_ENDPOINT_TCP);
        assert_string_equal(e.host, "redis.ci.example");
        assert_int_equal(e.port, 6380);
        assert_int_equal(e.db, 3);
        assert_null(e.path);
        redis_endpoint_done(&e);
        assert_null(e.host);
}

static void test_tcp_url_defaults_to_port_6379_and_db_0(void **state) {
        RedisEndpoint e;

        assert_int_equal(redis_endpoint_parse("redis://10.0.0.1", &e), 0);
        assert_string_equal(e.host, "10.0.0.1");
        assert_int_equal(e.port, 6379);
        assert_int_equal(e.db, 0);
        redis_endpoint_done(&e);
}

static void test_ipv6_host_loses_its_brackets(void **state) {
        RedisEndpoint e;

        assert_int_equal(redis_endpoint_parse("redis://[::1]:7000/1", &e), 0);
        assert_string_equal(e.host, "::1");
        assert_int_equal(e.port, 7000);
        assert_int_equal(e.db, 1);
        redis_endpoint_done(&e);
}

static void test_unix_url_gives_path_and_db(void **state) {
        RedisEndpoint e;

        assert_int_equal(redis_endpoint_parse("unix:///run/redis/redis.sock?db=2", &e), 0);
        assert_int_equal(e.type, REDIS_ENDPOINT_UNIX);
        assert_string_equal(e.path, "/run/redis/redis.sock");
        assert_null(e.host);
        assert_int_equal(e.db, 2);
        redis_endpoint_done(&e);

        assert_int_equal(redis_endpoint_parse("unix:///run/redis/redis.sock", &e), 0);
        assert_string_equal(e.path, "/run/redis/redis.sock");
        assert_int_equal(e.db, 0);
        redis_endpoint_done(&e);
}

static void test_bad_urls_are_refused_and_leave_the_result_untouched(void **state) {
        static const char *const bad[] = {
                "", "local", "http://x", "redis:/host", "redis://", "redis://:6379", "redis://host:",
                "redis://host:0", "redis://host:65536", "redis://host:99999999999999999999", "redis://host:port",
                "redis://host/", "redis://host/db", "redis://host/2147483648", "redis://host/1/2",
                "redis://user@host", "redis://user:pw@host", "redis://[]:1", "redis://[::1", "redis://[fe80::1%eth0]",
                "redis://host?db=1", "redis://ho st", "unix://", "unix:///", "unix://relative.sock",
                "unix://host/run/redis.sock", "unix:///run/redis.sock?", "unix:///run/redis.sock?db=",
                "unix:///run/redis.sock?db=x", "unix:///run/redis.sock?db=1&x=2", "unix:///run/redis.sock?database=1",
                "unix:///run/re%20dis.sock",
        };

        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                RedisEndpoint e = { .type = REDIS_ENDPOINT_UNIX, .port = 42 };
                int r = redis_endpoint_parse(bad[i], &e);
                if (r != -EINVAL)
                        fail_msg("\"%s\": %d, expected -EINVAL", bad[i], r);
                assert_int_equal(e.port, 42);
                assert_null(e.host);
        }
}

static void test_longest_unix_path_fits_and_one_more_byte_does_not(void **state) {
        char url[256] = "unix:///";
        RedisEndpoint e;

        /* 107 bytes of path: a sockaddr_un's 108 with the NUL */
        memset(url + strlen(url), 'a', 106);
        assert_int_equal(redis_endpoint_parse(url, &e), 0);
        assert_int_equal(strlen(e.path), 107);
        redis_endpoint_done(&e);

        strcat(url, "a");
        assert_int_equal(redis_endpoint_parse(url, &e), -EINVAL);
}

static void test_tls_url_says_it_is_not_supported(void **state) {
        RedisEndpoint e;

        assert_int_equal(redis_endpoint_parse("rediss://redis:6380/0", &e), -EPROTONOSUPPORT);
}

static void test_copy_is_deep(void **state) {
        RedisEndpoint e, c;

        assert_int_equal(redis_endpoint_parse("redis://h:1/2", &e), 0);
        assert_int_equal(redis_endpoint_copy(&e, &c), 0);
        assert_ptr_not_equal(c.host, e.host);
        redis_endpoint_done(&e);
        assert_string_equal(c.host, "h");
        assert_int_equal(c.port, 1);
        assert_int_equal(c.db, 2);
        redis_endpoint_done(&c);
}

static void test_sentinel_url_gives_sentinels_master_and_db(void **state) {
        RedisEndpoint e;

        assert_int_equal(redis_endpoint_parse("redis-sentinel://s1.ci:26380,10.0.0.2,[::1]:5/grid-redis?db=4", &e), 0);
        assert_int_equal(e.type, REDIS_ENDPOINT_SENTINEL);
        assert_int_equal(e.n_sentinels, 3);
        assert_string_equal(e.sentinels[0].host, "s1.ci");
        assert_int_equal(e.sentinels[0].port, 26380);
        assert_string_equal(e.sentinels[1].host, "10.0.0.2");
        assert_int_equal(e.sentinels[1].port, 26379);
        assert_string_equal(e.sentinels[2].host, "::1");
        assert_int_equal(e.sentinels[2].port, 5);
        assert_string_equal(e.master, "grid-redis");
        assert_int_equal(e.db, 4);
        assert_null(e.host);
        assert_null(e.path);
        redis_endpoint_done(&e);
        assert_null(e.sentinels);
        assert_null(e.master);

        assert_int_equal(redis_endpoint_parse("redis-sentinel://s1/mymaster", &e), 0);
        assert_int_equal(e.n_sentinels, 1);
        assert_int_equal(e.sentinels[0].port, 26379);
        assert_int_equal(e.db, 0);
        redis_endpoint_done(&e);
}

static void test_bad_sentinel_urls_are_refused(void **state) {
        static const char *const bad[] = {
                "redis-sentinel://", "redis-sentinel://s1", "redis-sentinel://s1/", "redis-sentinel:///m",
                "redis-sentinel://s1,/m", "redis-sentinel://,s1/m", "redis-sentinel://s1,,s2/m",
                "redis-sentinel://s1:0/m", "redis-sentinel://s1:26379,s1/m", "redis-sentinel://s1/m/0",
                "redis-sentinel://s1/m?db=", "redis-sentinel://s1/m?db=x", "redis-sentinel://s1/m?x=1",
                "redis-sentinel://s1/m?", "redis-sentinel://s1/m n", "redis-sentinel://pw@s1/m",
                "redis-sentinel://s1/m?db=2147483648",
                "redis-sentinel://a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q/m",
        };

        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                RedisEndpoint e = { .type = REDIS_ENDPOINT_UNIX, .port = 42 };
                int r = redis_endpoint_parse(bad[i], &e);
                if (r != -EINVAL)
                        fail_msg("\"%s\": %d, expected -EINVAL", bad[i], r);
                assert_int_equal(e.port, 42);
                assert_null(e.sentinels);
        }
}

static void test_sixteen_sentinels_fit(void **state) {
        RedisEndpoint e;

        assert_int_equal(redis_endpoint_parse("redis-sentinel://a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p/m", &e), 0);
        assert_int_equal(e.n_sentinels, REDIS_ENDPOINT_SENTINELS_MAX);
        assert_string_equal(e.sentinels[15].host, "p");
        redis_endpoint_done(&e);
}

static void test_sentinel_copy_is_deep_and_primary_keeps_the_db(void **state) {
        RedisEndpoint e, c, p;

        assert_int_equal(redis_endpoint_parse("redis-sentinel://s1,s2:7/m?db=3", &e), 0);
        assert_int_equal(redis_endpoint_copy(&e, &c), 0);
        assert_ptr_not_equal(c.sentinels, e.sentinels);
        assert_ptr_not_equal(c.sentinels[1].host, e.sentinels[1].host);
        redis_endpoint_done(&e);
        assert_int_equal(c.n_sentinels, 2);
        assert_string_equal(c.sentinels[1].host, "s2");
        assert_int_equal(c.sentinels[1].port, 7);
        assert_string_equal(c.master, "m");

        assert_int_equal(redis_endpoint_sentinel_primary(&c, "10.1.1.1", 6390, &p), 0);
        assert_int_equal(p.type, REDIS_ENDPOINT_TCP);
        assert_string_equal(p.host, "10.1.1.1");
        assert_int_equal(p.port, 6390);
        assert_int_equal(p.db, 3);
        redis_endpoint_done(&p);
        redis_endpoint_done(&c);

        assert_int_equal(redis_endpoint_parse("redis://h", &e), 0);
        assert_int_equal(redis_endpoint_sentinel_primary(&e, "h", 1, &p), -EINVAL);
        redis_endpoint_done(&e);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_tcp_url_gives_host_port_and_db),
                cmocka_unit_test(test_tcp_url_defaults_to_port_6379_and_db_0),
                cmocka_unit_test(test_ipv6_host_loses_its_brackets),
                cmocka_unit_test(test_unix_url_gives_path_and_db),
                cmocka_unit_test(test_bad_urls_are_refused_and_leave_the_result_untouched),
                cmocka_unit_test(test_longest_unix_path_fits_and_one_more_byte_does_not),
                cmocka_unit_test(test_tls_url_says_it_is_not_supported),
                cmocka_unit_test(test_copy_is_deep),
                cmocka_unit_test(test_sentinel_url_gives_sentinels_master_and_db),
                cmocka_unit_test(test_bad_sentinel_urls_are_refused),
                cmocka_unit_test(test_sixteen_sentinels_fit),
                cmocka_unit_test(test_sentinel_copy_is_deep_and_primary_keeps_the_db),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
