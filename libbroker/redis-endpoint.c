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

static int parse_tcp(const char *p, RedisEndpoint *ret) {
        _cleanup_free_ char *host = NULL;
        unsigned long port = REDIS_ENDPOINT_DEFAULT_PORT, db = 0;
        const char *e;

        if (*p == '[') {
                e = strchr(p, ']');
                if (!e || e == p + 1 || strspn(p + 1, "0123456789abcdefABCDEF:.") != (size_t) (e - p - 1))
                        return -EINVAL;
                host = strndup(p + 1, (size_t) (e - p - 1));
                p = e + 1;
        } else {
                size_t n = strspn(p, HOST_NAME_CHARS);
                if (n == 0 || n > 253)
                        return -EINVAL;
                host = strndup(p, n);
                p += n;
        }
        if (!host)
                return -ENOMEM;
        if (*p == ':') {
                p++;
                if (parse_decimal(&p, 65535, &port) < 0 || port == 0)
                        return -EINVAL;
        }
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
                .port = (uint16_t) port,
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
        if (q) {
                q++;
                if (!startswith(q, "db="))
                        return -EINVAL;
                q += strlen("db=");
                if (parse_decimal(&q, INT_MAX, &db) < 0 || *q != '\0')
                        return -EINVAL;
        }
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
        if (startswith(url, "rediss://"))
                return -EPROTONOSUPPORT;
        return -EINVAL;
}

void redis_endpoint_done(RedisEndpoint *e) {
        if (!e)
                return;
        free(e->host);
        free(e->path);
        *e = (RedisEndpoint) { .type = _REDIS_ENDPOINT_TYPE_INVALID };
}

int redis_endpoint_copy(const RedisEndpoint *e, RedisEndpoint *ret) {
        _cleanup_free_ char *host = NULL, *path = NULL;

        assert_return(e, -EINVAL);
        assert_return(ret, -EINVAL);

        if (strdup_or_null(e->host, &host) < 0 || strdup_or_null(e->path, &path) < 0)
                return -ENOMEM;
        *ret = *e;
        ret->host = TAKE_PTR(host);
        ret->path = TAKE_PTR(path);
        return 0;
}
