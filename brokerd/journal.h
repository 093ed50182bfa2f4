/* SPDX-License-Identifier: MIT */
/* journal.h — structured entries to journald over its native protocol, without ever blocking:
 * sd_journal_send() waits when journald falls behind; this writer queues a bounded backlog instead
 * and counts what it had to drop, so that a later entry can say so. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/uio.h>

#define JOURNAL_SOCKET_PATH "/run/systemd/journal/socket"
/* Entries waiting for journald to drain its socket; past it, entries are counted as dropped. */
#define JOURNAL_BACKLOG_MAX 4096

typedef struct JournalEntry JournalEntry;

typedef struct JournalWriter {
        int fd;
        char *path;
        JournalEntry *head, *tail;
        size_t n_backlog;
        unsigned long dropped;     /* since the last entry that reported them */
        bool connected;
} JournalWriter;

/* path NULL: JOURNAL_SOCKET_PATH. Never fails: without journald, entries are dropped and counted. */
void journal_writer_init(JournalWriter *w, const char *path);
void journal_writer_done(JournalWriter *w);

/* Sends one entry of "FIELD=value" items (values may hold newlines; the protocol's binary form is
 * used then). Returns 0 when sent, 1 when queued behind a full socket, -ENOTCONN when no journald listens
 * (not counted), -ENOBUFS when dropped (counted), -ENOMEM. */
int journal_writer_send(JournalWriter *w, const struct iovec *fields, size_t n_fields);

/* Retries the backlog; call when the socket may have drained (a timer does). Returns entries left. */
size_t journal_writer_flush(JournalWriter *w);

/* The count of entries dropped since the last call, which resets it. */
unsigned long journal_writer_take_dropped(JournalWriter *w);
