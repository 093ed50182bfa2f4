/* SPDX-License-Identifier: MIT */
/* persistence.h — whether a lease may be granted, as far as the state directory goes (SPEC §3.4): never
 * before what was persisted has been read, and never unless it is persisted (lease-persistence=required,
 * the default); with lease-persistence=best-effort a lease that could not be written is granted all the
 * same. Each episode of refusals (or of unpersisted grants) is logged when it starts and when it ends,
 * not once per request. */
#pragma once

#include <stdbool.h>

#include "conf.h"

/* In the state directory: held (flock) by the one brokerd that reads and writes it (manager.c). */
#define STATE_LOCK_FILE "brokerd.lock"

typedef struct LeaseLog LeaseLog;

typedef struct Persistence {
        LeasePersistence mode;          /* as at start: a reload does not change it */
        LeaseLog *log;                  /* NULL until what was persisted has been read */
        bool state_loaded;              /* what was persisted has been read */
        bool damaged;                   /* STATE_DAMAGE_FILE is there: a read missed something */
        bool refusing;                  /* an episode of refusals for want of persistence: logged once */
        unsigned refused;               /* requests refused in it */
        bool unpersisted;               /* best-effort: an episode of grants that were not written */
        unsigned unpersisted_grants;
} Persistence;

/* Why no new lease may be granted now (a few words for the audit), or NULL when one may. */
const char *persistence_refusal(const Persistence *p);

/* A request was refused for want of persistence (why: as persistence_refusal() or the failed write says). */
void persistence_note_refused(Persistence *p, const char *why);

/* A lease row's write came back (LEASE_EVENT_PERSISTED's result). Returns true when the grant may be answered:
 * it was written, or best-effort allows it without. */
bool persistence_commit_allows_grant(Persistence *p, const char *lease_id, int result);

/* Leases can be written again: the episodes end. */
void persistence_recovered(Persistence *p);
