/* SPDX-License-Identifier: MIT */
/* node.h — who this daemon is in shared pools: a random id kept in the state directory, so that a restart
 * is the same node (its leases are reclaimed, not lost), and a name for people (node-name=, else the
 * hostname) shown in Status and the journal of every node. */
#pragma once

#include <stddef.h>

#include "macro.h"

#define NODE_ID_HEX 32                  /* 128 random bits */
#define NODE_ID_FILE "node-id"

typedef struct Node {
        char id[NODE_ID_HEX + 1];
        char *name;
} Node;

/* Reads STATE_DIRECTORY/node-id, or makes it (O_EXCL: two daemons on one directory agree on the first
 * one's id); name is node-name= (NULL: the hostname). A file that is not 32 hex digits is moved aside and
 * replaced. random_bytes fills a new id. Returns 0, or negative errno (the directory is unwritable, …). */
int node_load(const char *state_directory, const char *name,
              void (*random_bytes)(void *buf, size_t n, void *userdata), void *userdata, Node *ret);
void node_done(Node *n);
