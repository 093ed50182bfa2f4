/* SPDX-License-Identifier: MIT */
/* persistence.h — whether a lease may be granted, as far as the state directory goes (SPEC §3.4): never
 * before what was persisted has been read, and never unless it is persisted (lease-persistence=required,
 * the default); with lease-persistence=best-effort a lease that could not be written is granted all the
 * same. Each episode of refusals (or of unpersisted grants) is logged when it starts and when it ends,
 * not once per request. */
#pragma once

#include <stdbool.h>

typedef struct Manager Manager;
typedef struct Lease Lease;

/* Why no new lease may be granted now (a few words for the audit), or NULL when one may. */
const char *persistence_refusal(Manager *m);

/* A request was refused for want of persistence (why: as persistence_refusal() or the failed write says). */
void persistence_note_refused(Manager *m, const char *why);

/* A lease commit came back (result as HistoryDoneFn's). Returns true when the grant may be answered:
 * it was written, or best-effort allows it without. */
bool persistence_commit_allows_grant(Manager *m, Lease *l, int result);

/* Leases can be written again: the episodes end. */
void persistence_recovered(Manager *m);
