/* SPDX-License-Identifier: MIT */
/* history-schema.h — what tells brokerd's history database from any other SQLite file: shared by brokerd,
 * which writes it, and `slotctl simulate --replay`, which reads it. */
#pragma once

/* application_id in the database header ("SLOT"): tells our file from another program's. */
#define HISTORY_APPLICATION_ID 0x534c4f54

/* user_version: the schema version this build writes, the number of migrations in brokerd/history-db.c
 * (which checks that they agree). Readers take versions 1 to this one; a higher one is a newer brokerd's. */
#define HISTORY_SCHEMA_VERSION 9

/* The condition of events' decision index (schema 9: events_unusual_decision): every decision but the two that
 * nearly every row has. A query that filters on another decision says it too, to be planned on the index. */
#define HISTORY_UNUSUAL_DECISION "decision NOT IN ('granted', 'released')"
