/* SPDX-License-Identifier: MIT */
/* shared-rig.h — shared pools for the tests that compare them with in-process ones (test-shared-diff,
 * test-engine-shared): brokerd's Backend on a loop of the test's own, its pools in the manual clock mode
 * (memo §3.10: the engine's `now` is the pool clock), and a quiesce() that runs the loop until every answer
 * is in. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "backend.h"
#include "node.h"

/* Pools of the rig get a node TTL on the virtual clock longer than any gap between the engine's instants
 * (every run() is a heartbeat in the manual mode), so that the node never expires: configurations built
 * by hand get 1000 days (test-engine jumps 11 days at once), scenario files conf.c's maximum (they span
 * minutes). */
#define SHARED_RIG_NODE_TTL (UINT64_C(1000) * 24 * USEC_PER_HOUR)
#define SHARED_RIG_NODE_TTL_TEXT "24h"

typedef struct SharedRig {
        sd_event *event;
        BackendTable table;
        Node node;
        uint64_t random_state;
} SharedRig;

/* The factory to install is backend_table_pool_new with &rig->table. Fails the test on error. */
void shared_rig_init(SharedRig *rig);
void shared_rig_done(SharedRig *rig);
/* Runs the loop until every call the engine's last command made was answered and this node's stream was
 * read as far as the answers say it was written (no decision can still be on its way); fails the test
 * after a minute. Returns whether there was anything to wait for: the caller then lets the engine take
 * the decisions, which may make calls of their own, and calls it again. */
bool shared_rig_quiesce(SharedRig *rig);
