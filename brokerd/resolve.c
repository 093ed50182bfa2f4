/* SPDX-License-Identifier: MIT */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include "macro.h"
#include "resolve.h"

/* Shared by the loop and the lookup's thread; the last of the two to let go frees it. */
typedef struct Lookup {
        unsigned n_ref;                 /* atomic */
        int fd;                         /* eventfd: the thread's "done" */
        char *host;
        struct addrinfo hints;
        int error;                      /* written by the thread before it signals */
        struct addrinfo *result;
} Lookup;

struct ResolveQuery {
        Lookup *lookup;
        sd_event_source *source;
        ResolveFn fn;
        void *userdata;
};

static void lookup_unref(Lookup *l) {
        if (!l || __atomic_sub_fetch(&l->n_ref, 1, __ATOMIC_ACQ_REL) > 0)
                return;
        safe_close(l->fd);
        if (l->result)
                freeaddrinfo(l->result);
        free(l->host);
        free(l);
}

static void *lookup_thread(void *p) {
        Lookup *l = p;
        uint64_t one = 1;

        l->error = getaddrinfo(l->host, NULL, &l->hints, &l->result);
        if (l->error == EAI_SYSTEM)
                l->error = negative_errno();
        /* The eventfd's write orders the result before the loop's read of it. */
        (void) !write(l->fd, &one, sizeof one);
        lookup_unref(l);
        return NULL;
}

static int on_done(sd_event_source *s, int fd, uint32_t revents, void *userdata) {
        ResolveQuery *q = userdata;
        Lookup *l = q->lookup;

        q->source = sd_event_source_disable_unref(q->source);
        q->fn(q, l->error, l->error == 0 ? l->result : NULL, q->userdata);
        return 0;
}

int resolve_getaddrinfo(sd_event *event, const char *host, const struct addrinfo *hints, ResolveFn fn,
                        void *userdata, ResolveQuery **ret) {
        ResolveQuery *q;
        Lookup *l;
        pthread_attr_t attr;
        pthread_t thread;
        sigset_t all, saved;
        int r;

        assert_return(event, -EINVAL);
        assert_return(host, -EINVAL);
        assert_return(fn, -EINVAL);
        assert_return(ret, -EINVAL);

        q = calloc(1, sizeof *q);
        l = calloc(1, sizeof *l);
        if (!q || !l) {
                free(q);
                free(l);
                return -ENOMEM;
        }
        *l = (Lookup) { .n_ref = 1, .fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), .host = strdup(host) };
        if (hints)
                l->hints = (struct addrinfo) { .ai_flags = hints->ai_flags, .ai_family = hints->ai_family,
                                               .ai_socktype = hints->ai_socktype, .ai_protocol = hints->ai_protocol };
        *q = (ResolveQuery) { .lookup = l, .fn = fn, .userdata = userdata };
        if (l->fd < 0 || !l->host) {
                r = l->fd < 0 ? negative_errno() : -ENOMEM;
                goto fail;
        }
        r = sd_event_add_io(event, &q->source, l->fd, EPOLLIN, on_done, q);
        if (r < 0)
                goto fail;
        (void) sd_event_source_set_description(q->source, "resolve");

        /* The thread takes no signal: the loop's are blocked for signalfd, and must stay so everywhere. */
        r = -pthread_attr_init(&attr);
        if (r < 0)
                goto fail;
        (void) pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        sigfillset(&all);
        (void) pthread_sigmask(SIG_SETMASK, &all, &saved);
        l->n_ref++; /* the thread's, before it can run */
        r = -pthread_create(&thread, &attr, lookup_thread, l);
        (void) pthread_sigmask(SIG_SETMASK, &saved, NULL);
        pthread_attr_destroy(&attr);
        if (r < 0) {
                l->n_ref--;
                goto fail;
        }
        *ret = q;
        return 0;
fail:
        resolve_query_free(q);
        return r;
}

ResolveQuery *resolve_query_free(ResolveQuery *q) {
        if (!q)
                return NULL;
        sd_event_source_disable_unref(q->source);
        lookup_unref(q->lookup);
        return mfree(q);
}
