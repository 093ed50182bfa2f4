/* SPDX-License-Identifier: MIT */
#include <endian.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "journal.h"
#include "macro.h"

struct JournalEntry {
        JournalEntry *next;
        size_t size;
        char data[];
};

void journal_writer_init(JournalWriter *w, const char *path) {
        *w = (JournalWriter) { .fd = -EBADF };
        w->path = strdup(path ?: JOURNAL_SOCKET_PATH);
}

void journal_writer_done(JournalWriter *w) {
        while (w->head) {
                JournalEntry *e = w->head;
                w->head = e->next;
                free(e);
        }
        w->fd = safe_close(w->fd);
        free(w->path);
        *w = (JournalWriter) { .fd = -EBADF };
}

static int journal_connect(JournalWriter *w) {
        if (w->fd >= 0)
                return 0;
        if (!w->path)
                return -ENOMEM;
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        if (strlen(w->path) >= sizeof sa.sun_path)
                return -ENAMETOOLONG;
        strcpy(sa.sun_path, w->path);
        int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return negative_errno();
        /* connect() on a datagram socket only sets the default peer: it never waits. */
        if (connect(fd, (struct sockaddr *) &sa, sizeof sa) < 0) {
                int r = negative_errno();
                safe_close(fd);
                return r;
        }
        w->fd = fd;
        return 0;
}

/* The native protocol: "FIELD=value\n", or for values with a newline "FIELD\n" + 64-bit LE length + value + "\n". */
static char *serialize(const struct iovec *fields, size_t n, size_t *ret_size) {
        size_t size = 0;
        for (size_t i = 0; i < n; i++)
                size += fields[i].iov_len + 1 + 8;
        char *buf = malloc(size ?: 1), *p = buf;
        if (!buf)
                return NULL;
        for (size_t i = 0; i < n; i++) {
                const char *f = fields[i].iov_base;
                size_t len = fields[i].iov_len;
                const char *eq = memchr(f, '=', len);
                if (!eq)
                        continue; /* not a field: skip rather than corrupt the entry */
                if (!memchr(eq + 1, '\n', len - (size_t) (eq + 1 - f))) {
                        memcpy(p, f, len);
                        p += len;
                        *p++ = '\n';
                        continue;
                }
                size_t name_len = (size_t) (eq - f), value_len = len - name_len - 1;
                memcpy(p, f, name_len);
                p += name_len;
                *p++ = '\n';
                uint64_t le = htole64(value_len);
                memcpy(p, &le, 8);
                p += 8;
                memcpy(p, eq + 1, value_len);
                p += value_len;
                *p++ = '\n';
        }
        *ret_size = (size_t) (p - buf);
        return buf;
}

/* 1: sent; 0: the socket is full (try later); < 0: cannot be sent. */
static int send_raw(JournalWriter *w, const char *data, size_t size) {
        int r = journal_connect(w);
        if (r < 0)
                return r;
        if (send(w->fd, data, size, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0)
                return 1;
        if (errno == EAGAIN || errno == ENOBUFS)
                return 0;
        r = negative_errno();
        /* journald restarted (ECONNREFUSED) or went away: reconnect on the next entry. */
        w->fd = safe_close(w->fd);
        return r;
}

size_t journal_writer_flush(JournalWriter *w) {
        while (w->head) {
                JournalEntry *e = w->head;
                int r = send_raw(w, e->data, e->size);
                if (r == 0)
                        break;
                if (r < 0)
                        w->dropped++;
                w->head = e->next;
                if (!w->head)
                        w->tail = NULL;
                w->n_backlog--;
                free(e);
        }
        return w->n_backlog;
}

int journal_writer_send(JournalWriter *w, const struct iovec *fields, size_t n_fields) {
        size_t size;
        _cleanup_free_ char *data = serialize(fields, n_fields, &size);
        if (!data)
                return -ENOMEM;

        /* Order matters to a reader: nothing overtakes the backlog. */
        if (!w->head) {
                int r = send_raw(w, data, size);
                if (r > 0)
                        return 0;
                if (r == -ENOENT || r == -ECONNREFUSED)
                        return -ENOTCONN; /* no journald at all: not a loss to count, the caller says it elsewhere */
                if (r < 0) {
                        w->dropped++;
                        return -ENOBUFS;
                }
        }
        if (w->n_backlog >= JOURNAL_BACKLOG_MAX) {
                w->dropped++;
                return -ENOBUFS;
        }
        JournalEntry *e = malloc(sizeof(JournalEntry) + size);
        if (!e)
                return -ENOMEM;
        e->next = NULL;
        e->size = size;
        memcpy(e->data, data, size);
        if (w->tail)
                w->tail->next = e;
        else
                w->head = e;
        w->tail = e;
        w->n_backlog++;
        return 1;
}

unsigned long journal_writer_take_dropped(JournalWriter *w) {
        unsigned long d = w->dropped;
        w->dropped = 0;
        return d;
}
