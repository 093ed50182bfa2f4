/* SPDX-License-Identifier: MIT */
/* handover.h — the client connections handed to systemd's file descriptor store at a stop and taken back at
 * the next start (SPEC §3.4, "A restart loses no waiter"): the state they need, its format (one JSON object
 * in a memfd, versioned), and the fds' way to the store and back. It knows no session: its owner fills the
 * entries at the stop and acts on them at the start.
 *
 * The store gets the state's memfd first (FDNAME=sb-state), then every connection's socket (FDNAME=sb-conn).
 * A socket is matched to its entry by its inode, not by order or name, so that whatever the store kept —
 * a state without sockets, sockets without a state (a crash between the two), a state cut short — each
 * socket either finds its entry or is closed, never guessed at. The state is emptied (truncated) once read,
 * so it cannot be used twice, and the store is flushed (FDSTOREREMOVE=1) before anyone is served. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "engine.h"
#include "time-util.h"

#define HANDOVER_FORMAT "slotbroker-handover"
/* 2: a waiter carries its lane's labels= and also= as it queued under them ("laneRules"). A brokerd reads
 * both (a version 1 state has none: its waiters resume under the lane as it is now); one of version 1 reads a
 * state of version 2 as a format it does not know, not as damage. */
#define HANDOVER_VERSION 2
#define HANDOVER_VERSION_OLDEST 1
#define HANDOVER_FDNAME_STATE "sb-state"
#define HANDOVER_FDNAME_CONNECTION "sb-conn"
/* A state larger than this is damage, not a state: every connection's output cap (1 MiB by default) times
 * the default connection limit would be 8 GiB, but a handover is made after the output was flushed. */
#define HANDOVER_STATE_MAX ((size_t) 512 << 20)

/* An Acquire in progress on the connection: waiting (pool set), or holding a lease (lease set). */
typedef struct HandoverAcquire {
        char *lane;
        char *job;                /* NULL: none */
        unsigned slots;
        char **labels;            /* the client's selector terms, or NULL */
        char *member;             /* NULL: none */
        bool more;
        bool fence;
        usec_t max_hold;          /* the client's cap; USEC_INFINITY: none */
        usec_t max_wait;          /* the client's queueWaitMs; USEC_INFINITY: none */
        uint64_t last_position;   /* 1-based as last sent; 0: none yet */
        uint64_t last_queued;
        bool has_command;
        pid_t command_pid;
        uint64_t command_start;   /* clock ticks since boot */
        /* Waiting: the queue it waits in and what the engine decided when it joined it. */
        char *pool;
        usec_t arrival;           /* monotonic µs */
        QueueState state;
        usec_t idle;
        usec_t budget;            /* USEC_INFINITY: unbounded */
        uint64_t position;        /* 0-based, in that queue: the order of resumption */
        char *remote_id;          /* a shared pool's name for the waiter, or NULL */
        char *lane_rules;         /* engine_request_lane_rules(), or NULL (a state without it) */
        /* Holding: the lease's id (the lease itself comes from the lease log, never from here). */
        char *lease;
} HandoverAcquire;

typedef struct HandoverConnection {
        uint64_t ino;             /* the socket's inode and device: what the fd is matched by */
        uint64_t dev;
        void *input;              /* received, not yet taken as calls (a deferred call first) */
        size_t n_input;
        void *output;             /* queued, not yet sent */
        size_t n_output;
        bool has_acquire;
        HandoverAcquire acquire;
        usec_t peer_since;        /* connection_get_peer_since() (CLOCK_BOOTTIME, this boot); 0: not told */
        int fd;                   /* the socket: to send, or as taken back; -EBADF: none */
} HandoverConnection;

typedef struct HandoverPool {
        char *name;
        usec_t last_fast;         /* the pool's controlled-delay clock (engine_pool_get_last_fast()) */
} HandoverPool;

typedef struct Handover {
        HandoverConnection *connections;
        size_t n_connections;
        size_t allocated;
        HandoverPool *pools;
        size_t n_pools;
} Handover;

void handover_acquire_done(HandoverAcquire *a);
/* Frees one entry (closing its fd): an owner that acts on the entries one by one frees each after it. */
void handover_connection_done(HandoverConnection *c);
/* Frees the entries; closes the fds still in them. */
void handover_done(Handover *h);
/* A new entry at the end, zeroed (fd -EBADF). Returns 0 or -ENOMEM. */
int handover_add_connection(Handover *h, HandoverConnection **ret);
int handover_add_pool(Handover *h, const char *name, usec_t last_fast);

/* The state as bytes: boot_id (32 hex digits), the writer's pid and monotonic now. Pure. Returns 0 or
 * -ENOMEM. */
int handover_format(const Handover *h, const char *boot_id, pid_t pid, usec_t now, char **ret, size_t *ret_size);
/* Bytes back to a state; every value checked (the fds are left -EBADF). Pure. Returns 0; -EBADMSG (not a
 * state, cut short, a value out of range), -EPROTONOSUPPORT (another format or a newer version), -ESTALE
 * (written on another boot, or in the future of `now`), -ENOMEM. */
int handover_parse(const void *data, size_t size, const char *boot_id, usec_t now, Handover *ret);

/* This boot's id, 32 hex digits and a NUL. Returns 0 or negative errno. */
int handover_boot_id(char ret[static 33]);

/* Hands the connections' sockets (h->connections[i].fd) and the state to the store at $NOTIFY_SOCKET. The
 * fds stay the caller's. Returns 0 when the state and every socket went (the store may still drop what is
 * beyond its FileDescriptorStoreMax=: those clients see their connection close); -ENXIO without
 * $NOTIFY_SOCKET; another negative errno when the state could not go (then nothing usable went). */
int handover_send(const Handover *h, usec_t now);

/* The fds systemd passed besides the listening socket, sorted by name. */
typedef struct HandoverFds {
        int *states;              /* sb-state: normally one */
        size_t n_states;
        int *connections;         /* sb-conn */
        size_t n_connections;
} HandoverFds;

/* Takes fd (named name) if it is the handover's: true, or false for anything else (left to the caller). */
bool handover_fds_take(HandoverFds *f, const char *name, int fd);
/* Closes what is left (a connection: shut down first, so that its client sees the end). */
void handover_fds_done(HandoverFds *f);

typedef struct HandoverLoad {
        int error;                /* why the state could not be used (negative errno), or 0 */
        size_t matched;           /* sockets matched to an entry */
        size_t closed;            /* sockets without an entry: closed */
} HandoverLoad;

/* The state read (the last one, if several), emptied, parsed, and each socket matched to its entry
 * (entries without a socket are dropped, sockets without an entry closed); the store is flushed. The sockets
 * and the states leave f. Returns 0 (with *ret filled, perhaps empty: see ret_load) or -ENOMEM. */
int handover_load(HandoverFds *f, usec_t now, Handover *ret, HandoverLoad *ret_load);
