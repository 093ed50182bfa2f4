/* SPDX-License-Identifier: MIT */
/* redis-endpoint.h — where a shared pool's Redis is: the URL forms of brokerd.conf(5)'s backend=.
 *
 *   redis://HOST[:PORT][/DB]      HOST a name, an IPv4 address or [IPv6]; PORT 6379; DB 0 unless given
 *   unix:///PATH[?db=DB]          PATH absolute, short enough for a sockaddr_un
 *   redis-sentinel://H1[:P1],H2[:P2],…/MASTER[?db=DB]
 *                                 the Sentinels to ask which node is MASTER's primary (PORT 26379)
 *
 * No credentials in the URL (it is logged): the password comes from backend-password-file=. Parsing only;
 * resolving and connecting are the daemon's (brokerd/redis-link.h). */
#pragma once

#include <errno.h>
#include <stdint.h>

typedef enum RedisEndpointType {
        REDIS_ENDPOINT_TCP,
        REDIS_ENDPOINT_UNIX,
        REDIS_ENDPOINT_SENTINEL,
        _REDIS_ENDPOINT_TYPE_MAX,
        _REDIS_ENDPOINT_TYPE_INVALID = -EINVAL,
} RedisEndpointType;

typedef struct RedisSentinelAddress {
        char *host;             /* as RedisEndpoint's */
        uint16_t port;
} RedisSentinelAddress;

typedef struct RedisEndpoint {
        RedisEndpointType type;
        char *host;             /* TCP: a name or an address, an IPv6 address without its brackets */
        uint16_t port;          /* TCP */
        char *path;             /* UNIX */
        RedisSentinelAddress *sentinels; /* SENTINEL: in the URL's order, no two the same */
        size_t n_sentinels;
        char *master;           /* SENTINEL: the name the Sentinels monitor the primary by */
        unsigned db;            /* SELECT's argument (on the primary, for SENTINEL) */
} RedisEndpoint;

#define REDIS_ENDPOINT_DEFAULT_PORT 6379
#define REDIS_ENDPOINT_SENTINEL_DEFAULT_PORT 26379
/* More Sentinels than this is a typo, not a topology (3 or 5 is the usual number). */
#define REDIS_ENDPOINT_SENTINELS_MAX 16

/* Parses url into *ret (to be emptied with redis_endpoint_done()). Returns 0; -EPROTONOSUPPORT for
 * rediss:// (hiredis 0.14 has no TLS); -EINVAL for anything else that is not one of the forms above;
 * -ENOMEM. *ret is untouched on failure. */
int redis_endpoint_parse(const char *url, RedisEndpoint *ret);

void redis_endpoint_done(RedisEndpoint *e);

/* A deep copy of e in *ret. Returns 0 or -ENOMEM (*ret untouched then). */
int redis_endpoint_copy(const RedisEndpoint *e, RedisEndpoint *ret);

/* A TCP endpoint host:port with e's database, in *ret: where a Sentinel says e's primary is now.
 * Returns 0, -EINVAL (e not SENTINEL, host empty), -ENOMEM; *ret untouched on failure. */
int redis_endpoint_sentinel_primary(const RedisEndpoint *e, const char *host, uint16_t port, RedisEndpoint *ret);
