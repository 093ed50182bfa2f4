/* SPDX-License-Identifier: MIT */
/* connection.h — one client connection: its socket, credentials, Varlink stream, and the Acquire it
 * may have open (waiting, or holding a lease). Calls are answered in order; calls that arrive behind an
 * open Acquire wait in the input until it ends. */
#pragma once

#include <stdbool.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <systemd/sd-event.h>

#include "engine.h"
#include "list.h"
#include "poller.h"
#include "process.h"
#include "varlink.h"

typedef struct Connection Connection;
typedef struct Manager Manager;
typedef struct Lease Lease;

/* An Acquire call in progress. */
typedef struct AcquireCall {
        bool active;
        bool more;                 /* replies continue; otherwise one final reply */
        bool detach;
        char *lane;
        char *job;
        unsigned slots;
        usec_t max_hold;           /* the client's cap; USEC_INFINITY: none */
        EngineRequest *request;    /* while waiting */
        size_t last_position;      /* 1-based, as last sent; 0: none yet */
        size_t last_queued;
        usec_t last_position_check; /* monotonic; updates go out at most once a second */
        ListNode position_node;     /* Manager.position_queue, while waiting with "more" */
        bool counted_waiter;       /* counted in its uid's waiters */
        int command_pidfd;         /* the attached command, verified at the call */
        ProcessInfo command;
        bool has_command;
        Lease *pending;            /* granted, its row being written: the answer waits for it */
} AcquireCall;

struct Connection {
        Manager *manager;
        ListNode node;             /* Manager.connections, or Manager.closed_connections once closed */
        int fd;
        PollerWatch watch;         /* the socket, in Manager.poller */
        VarlinkStream stream;
        json_t *next_call;         /* taken from the stream, waiting for an open Acquire to end */
        VarlinkFds next_call_fds;  /* the fds passed with next_call */
        struct ucred cred;
        gid_t *groups;
        size_t n_groups;
        AcquireCall acquire;
        Lease *lease;              /* the lease this connection holds (its life line), if any */
        bool oneway;               /* the call being run wants no reply */
        bool history_pending;      /* a History call is answered later, from the writer thread */
        bool read_eof;             /* the client shut its sending side: answer what it sent, then close */
        struct HistoryCall *history_call; /* the History reply being produced, page by page */
        size_t output_mark;        /* output_below runs once the unsent output is below this */
        void (*output_below)(Connection *c);
        unsigned dispatching;      /* calls are being run: their replies go out together at the end */
        bool closed;
};

/* Takes ownership of fd (an accepted socket). Returns 0 or negative errno; fd is closed on failure. */
int connection_new(Manager *m, int fd, Connection **ret);
/* Closes: a waiting request is withdrawn (audited "cancelled"), a held lease loses its life line. The
 * memory stays valid until the manager's next collection, so callers up the stack may still look. */
void connection_close(Connection *c);
void connection_free(Connection *c);

/* Queue a reply or an error on the connection; a connection whose unsent output passes its cap is closed
 * (later, from the loop: callers may still touch it). Return 0 or negative errno. */
int connection_reply(Connection *c, json_t *parameters, bool continues);
int connection_reply_error(Connection *c, const char *error, json_t *parameters);

/* A reply produced in parts as the client reads (History's): raw text, and JSON values without their
 * NUL (varlink_output_enqueue_json_part()); the last part ends with the NUL. Nothing else may be queued
 * meanwhile (the calls behind wait: the caller keeps the connection busy). They are sent at the next
 * connection_dispatch(). A connection whose unsent output would pass its cap is closed. Return 0 or
 * negative errno. */
int connection_reply_part(Connection *c, const void *data, size_t size);
int connection_reply_part_json(Connection *c, const json_t *value);
/* fn runs once, as soon as the unsent output is below mark bytes (at once, if it is). */
void connection_when_output_below(Connection *c, size_t mark, void (*fn)(Connection *c));

/* The Acquire on this connection ended (refused, or its lease ended): answer the calls behind it. */
void connection_acquire_done(Connection *c);

/* Answer pipelined calls that are ready; called when an Acquire ends. */
void connection_dispatch(Connection *c);

bool connection_is_waiting(const Connection *c);
