/* SPDX-License-Identifier: MIT */
/* shared-rules.h — a shared pool's rules as the text Redis keeps and every node compares (brokerd/lua/README,
 * "Rules canon"): two nodes agree on a pool when their canons are equal, byte for byte. */
#pragma once

#include <stddef.h>

#include "pool.h"

/* The canon of pool c with its lanes' rules and backend-node-ttl= (ttl): "key=value\n" lines sorted by key.
 * *ret is the caller's to free. Returns 0 or -ENOMEM. */
int shared_rules_canon(const PoolConfig *c, const PoolLaneRule *rules, size_t n_rules, usec_t ttl, char **ret);
