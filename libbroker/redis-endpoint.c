/* SPDX-License-Identifier: MIT */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "macro.h"
#include "redis-endpoint.h"

#define HOST_NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_"

static bool startswith(const char *s, const char *prefix) {
        return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* Decimal digits at *p, at least one, at most max; *p is moved past them. Leading zeros are accepted:
 * "/00" is DB 0, as Redis itself reads it. */
static int parse_decimal(const char **p, unsigned long max, unsigned long *ret) {
        size_t n = strspn(*p, "0123456789");
        unsigned long v = 0;

        if (n == 0)
                return -EINVAL;
        for (size_t i = 0; i < n; i++) {
                unsigned digit = (unsigned) ((*p)[i] - '0');
                if (v > (max - digit) / 10)
                        return -EINVAL;
                v = v * 10 + digit;
        }
        *p += n;
        *ret = v;
        return 0;
}

/* HOST[:PORT] at *p (HOST a name, an IPv4 address or [IPv6]); *p is moved past it. */
static int parse_host_port(const char **p, unsigned long default_port, char **ret_host, uint16_t *ret_port) {
        _cleanup_free_ char *host = NULL;
        unsigned long port = default_port;
        const char *s = *p, *e;

        if (*s == '[') {
                e = strchr(s, ']');
                if (!e || e == s + 1 || strspn(s + 1, "0123456789abcdefABCDEF:.") != (size_t) (e - s - 1))
                        return -EINVAL;
                host = strndup(s + 1, (size_t) (e - s - 1));
                s = e + 1;
        } else {
                size_t n = strspn(s, HOST_NAME_CHARS);
                if (n == 0 || n > 253)
                        return -EINVAL;
                host = strndup(s, n);
                s += n;
        }
        if (!host)
                return -ENOMEM;
        if (*s == ':') {
                s++;
                if (parse_decimal(&s, 65535, &port) < 0 || port == 0)
                        return -EINVAL;
        }
        *p = s;
        *ret_host = TAKE_PTR(host);
        *ret_port = (uint16_t) port;
        return 0;
}

static int parse_tcp(const char *p, RedisEndpoint *ret) {
        _cleanup_free_ char *host = NULL;
        unsigned long db = 0;
        uint16_t port;
        int r;

        r = parse_host_port(&p, REDIS_ENDPOINT_DEFAULT_PORT, &host, &port);
        if (r < 0)
                return r;
        if (*p == '/') {
                p++;
                if (parse_decimal(&p, INT_MAX, &db) < 0)
                        return -EINVAL;
        }
        if (*p != '\0')
                return -EINVAL;

        *ret = (RedisEndpoint) {
                .type = REDIS_ENDPOINT_TCP,
                .host = TAKE_PTR(host),
                .port = port,
                .db = (unsigned) db,
        };
        return 0;
}

/* "?db=N" at the end of a URL, or nothing. */
static int parse_db_query(const char *q, unsigned long *ret) {
        if (*q == '\0')
                return 0;
        if (!startswith(q, "?db="))
                return -EINVAL;
        q += strlen("?db=");
        if (parse_decimal(&q, INT_MAX, ret) < 0 || *q != '\0')
                return -EINVAL;
        return 0;
}

static void sentinels_free(RedisSentinelAddress *s, size_t n) {
        for (size_t i = 0; i < n; i++)
                free(s[i].host);
        free(s);
}

/* H1[:P1],H2[:P2],…/MASTER[?db=DB]. The Sentinels are asked in this order, so one listed twice would be
 * asked twice for nothing: refused, as a sign of a typo. */
static int parse_sentinel(const char *p, RedisEndpoint *ret) {
        RedisSentinelAddress *sentinels = calloc(REDIS_ENDPOINT_SENTINELS_MAX, sizeof(RedisSentinelAddress));
        _cleanup_free_ char *master = NULL;
        unsigned long db = 0;
        size_t n = 0;
        int r = 0;

        if (!sentinels)
                return -ENOMEM;
        for (;;) {
                if (n == REDIS_ENDPOINT_SENTINELS_MAX) {
                        r = -EINVAL;
                        break;
                }
                r = parse_host_port(&p, REDIS_ENDPOINT_SENTINEL_DEFAULT_PORT, &sentinels[n].host, &sentinels[n].port);
                if (r < 0)
                        break;
                for (size_t i = 0; i < n && r >= 0; i++)
                        if (sentinels[i].port == sentinels[n].port && streq(sentinels[i].host, sentinels[n].host))
                                r = -EINVAL;
                n++;
                if (r < 0 || *p != ',')
                        break;
                p++;
        }
        if (r >= 0 && *p != '/')
                r = -EINVAL;
        if (r >= 0) {
                size_t len = strspn(++p, HOST_NAME_CHARS);
                if (len == 0 || len > 255)
                        r = -EINVAL;
                else if (!(master = strndup(p, len)))
                        r = -ENOMEM;
                else
                        r = parse_db_query(p + len, &db);
        }
        if (r < 0) {
                sentinels_free(sentinels, n);
                return r;
        }

        *ret = (RedisEndpoint) {
                .type = REDIS_ENDPOINT_SENTINEL,
                .sentinels = sentinels,
                .n_sentinels = n,
                .master = TAKE_PTR(master),
                .db = (unsigned) db,
        };
        return 0;
}

static int parse_unix(const char *p, RedisEndpoint *ret) {
        const size_t path_max = sizeof(((struct sockaddr_un *) NULL)->sun_path) - 1;
        _cleanup_free_ char *path = NULL;
        unsigned long db = 0;
        const char *q = strchr(p, '?');
        size_t n = q ? (size_t) (q - p) : strlen(p);

        /* unix://host/path has no meaning here: the authority must be empty, the path absolute. */
        if (n < 2 || p[0] != '/' || n > path_max)
                return -EINVAL;
        /* '%' would suggest escapes we do not decode; a path that needs them is better renamed. */
        if (memchr(p, '%', n))
                return -EINVAL;
        if (q && parse_db_query(q, &db) < 0)
                return -EINVAL;
        path = strndup(p, n);
        if (!path)
                return -ENOMEM;

        *ret = (RedisEndpoint) {
                .type = REDIS_ENDPOINT_UNIX,
                .path = TAKE_PTR(path),
                .db = (unsigned) db,
        };
        return 0;
}

int redis_endpoint_parse(const char *url, RedisEndpoint *ret) {
        assert_return(url, -EINVAL);
        assert_return(ret, -EINVAL);

        if (startswith(url, "redis://"))
                return parse_tcp(url + strlen("redis://"), ret);
        if (startswith(url, "unix://"))
                return parse_unix(url + strlen("unix://"), ret);
        if (startswith(url, "redis-sentinel://"))
                return parse_sentinel(url + strlen("redis-sentinel://"), ret);
        if (startswith(url, "rediss://"))
                return -EPROTONOSUPPORT;
        return -EINVAL;
}

void redis_endpoint_done(RedisEndpoint *e) {
        if (!e)
                return;
        free(e->host);
        free(e->path);
        sentinels_free(e->sentinels, e->n_sentinels);
        free(e->master);
        *e = (RedisEndpoint) { .type = _REDIS_ENDPOINT_TYPE_INVALID };
}

int redis_endpoint_copy(const RedisEndpoint *e, RedisEndpoint *ret) {
        _cleanup_free_ char *host = NULL, *path = NULL, *master = NULL;
        RedisSentinelAddress *sentinels = NULL;

        assert_return(e, -EINVAL);
        assert_return(ret, -EINVAL);

        if (strdup_or_null(e->host, &host) < 0 || strdup_or_null(e->path, &path) < 0 ||
            strdup_or_null(e->master, &master) < 0)
                return -ENOMEM;
        if (e->n_sentinels > 0) {
                sentinels = calloc(e->n_sentinels, sizeof(RedisSentinelAddress));
                if (!sentinels)
                        return -ENOMEM;
                for (size_t i = 0; i < e->n_sentinels; i++) {
                        sentinels[i].port = e->sentinels[i].port;
                        if (!(sentinels[i].host = strdup(e->sentinels[i].host))) {
                                sentinels_free(sentinels, i);
                                return -ENOMEM;
                        }
                }
        }
        *ret = *e;
        ret->host = TAKE_PTR(host);
        ret->path = TAKE_PTR(path);
        ret->master = TAKE_PTR(master);
        ret->sentinels = sentinels;
        return 0;
}

int redis_endpoint_sentinel_primary(const RedisEndpoint *e, const char *host, uint16_t port, RedisEndpoint *ret) {
        char *copy;

        assert_return(e && e->type == REDIS_ENDPOINT_SENTINEL, -EINVAL);
        assert_return(host && *host && port > 0, -EINVAL);
        assert_return(ret, -EINVAL);

        copy = strdup(host);
        if (!copy)
                return -ENOMEM;
        *ret = (RedisEndpoint) { .type = REDIS_ENDPOINT_TCP, .host = copy, .port = port, .db = e->db };
        return 0;
}
