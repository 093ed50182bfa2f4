/* SPDX-License-Identifier: MIT */
/* redis-endpoint.h — where a shared pool's Redis is: the URL forms of brokerd.conf(5)'s backend=.
 *
 *   redis://HOST[:PORT][/DB]      HOST a name, an IPv4 address or [IPv6]; PORT 6379; DB 0 unless given
 *   unix:///PATH[?db=DB]          PATH absolute, short enough for a sockaddr_un
 *
 * No credentials in the URL (it is logged): the password comes from backend-password-file=. Parsing only;
 * resolving and connecting are the daemon's (brokerd/redis-link.h). */
#pragma once

#include <errno.h>
#include <stdint.h>

typedef enum RedisEndpointType {
        REDIS_ENDPOINT_TCP,
        REDIS_ENDPOINT_UNIX,
        _REDIS_ENDPOINT_TYPE_MAX,
        _REDIS_ENDPOINT_TYPE_INVALID = -EINVAL,
} RedisEndpointType;

typedef struct RedisEndpoint {
        RedisEndpointType type;
        char *host;             /* TCP: a name or an address, an IPv6 address without its brackets */
        uint16_t port;          /* TCP */
        char *path;             /* UNIX */
        unsigned db;            /* SELECT's argument */
} RedisEndpoint;

#define REDIS_ENDPOINT_DEFAULT_PORT 6379

/* Parses url into *ret (to be emptied with redis_endpoint_done()). Returns 0; -EPROTONOSUPPORT for
 * rediss:// (hiredis 0.14 has no TLS); -EINVAL for anything else that is not one of the forms above;
 * -ENOMEM. *ret is untouched on failure. */
int redis_endpoint_parse(const char *url, RedisEndpoint *ret);

void redis_endpoint_done(RedisEndpoint *e);

/* A deep copy of e in *ret. Returns 0 or -ENOMEM (*ret untouched then). */
int redis_endpoint_copy(const RedisEndpoint *e, RedisEndpoint *ret);
