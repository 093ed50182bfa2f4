/* SPDX-License-Identifier: MIT */
/* resolve.h — host names to addresses without blocking the event loop.
 *
 * getaddrinfo() may wait seconds for a DNS server; the loop must not. libsystemd's sd-resolve is not
 * public API (Debian 12's libsystemd-dev has no sd-resolve.h), and glibc's getaddrinfo_a() signals its
 * end from a thread of its own and cannot always cancel. So each lookup is a short-lived thread of ours
 * that calls getaddrinfo() and wakes the loop through an eventfd; a cancelled lookup runs on, unheard, and
 * frees itself. */
#pragma once

#include <netdb.h>
#include <systemd/sd-event.h>

typedef struct ResolveQuery ResolveQuery;

/* error: 0, or getaddrinfo()'s EAI_* code (gai_strerror()), or a negative errno; ai valid during the call
 * only. The query is over when this is called: the callee frees it with resolve_query_free(). */
typedef void (*ResolveFn)(ResolveQuery *q, int error, const struct addrinfo *ai, void *userdata);

/* Starts looking host up (hints as getaddrinfo()'s). Returns 0 and the query in *ret, or negative errno. */
int resolve_getaddrinfo(sd_event *event, const char *host, const struct addrinfo *hints, ResolveFn fn,
                        void *userdata, ResolveQuery **ret);

/* Cancels a query in flight (fn is not called) or frees one that has ended. Returns NULL. */
ResolveQuery *resolve_query_free(ResolveQuery *q);
