/* SPDX-License-Identifier: MIT */
/* node.h — who this daemon is in shared pools: a random id kept in the state directory, so that a restart
 * is the same node (its leases are reclaimed, not lost), and a name for people (node-name=, else the
 * hostname) shown in Status and the journal of every node. */
#pragma once

#include <stddef.h>

#include "macro.h"

#define NODE_ID_HEX 32                  /* 128 random bits */
#define NODE_ID_FILE "node-id"
#define NODE_INCARNATION_HEX 16         /* 64 random bits per start */
#define NODE_INCARNATION_FILE "incarnation"
#define NODE_PREVIOUS_MAX 4             /* incarnations a start may succeed (crashes before a first tick) */

typedef struct Node {
        char id[NODE_ID_HEX + 1];
        char *name;
        /* "INCARNATION/PREVIOUS,…" (brokerd/lua/README, "One node, one identity"): this start's random
         * incarnation, and the ones it succeeds — the last starts from this state directory on this boot,
         * whose processes are gone. Hosts cloned from one image carry the same id but no claim to
         * succeed a live process: Redis refuses the second while the first heartbeats. */
        char *identity;
        /* The start recorded in the state directory is a live process of this boot, not this one: the
         * directory is a copy of a running daemon's (or in use by one). Its lease log is that daemon's. */
        bool predecessor_alive;
} Node;

/* Reads STATE_DIRECTORY/node-id, or makes it (O_EXCL: two daemons on one directory agree on the first
 * one's id); name is node-name= (NULL: the hostname). A file that is not 32 hex digits is moved aside and
 * replaced. random_bytes fills a new id and this start's incarnation, which is written durably to
 * STATE_DIRECTORY/incarnation (with the boot id, pid and start time of this process) before it returns,
 * so before any script call carries it. Returns 0, or negative errno (the directory is unwritable, …). */
int node_load(const char *state_directory, const char *name,
              void (*random_bytes)(void *buf, size_t n, void *userdata), void *userdata, Node *ret);
void node_done(Node *n);
