/* SPDX-License-Identifier: MIT */
/* history-schema.h — what tells brokerd's history database from any other SQLite file: shared by brokerd,
 * which writes it, and `slotctl simulate --replay`, which reads it. */
#pragma once

#include <stdbool.h>
#include <string.h>

/* application_id in the database header ("SLOT"): tells our file from another program's. */
#define HISTORY_APPLICATION_ID 0x534c4f54

/* user_version: the schema version this build writes, the number of migrations in brokerd/history-db.c
 * (which checks that they agree). Readers take versions 1 to this one; a higher one is a newer brokerd's. */
#define HISTORY_SCHEMA_VERSION 10

/* The two decisions nearly every row has, which events' decision index leaves out (schema 9:
 * events_unusual_decision). A query that filters on another decision says the index's condition too, to be
 * planned on it. */
#define HISTORY_USUAL_DECISION_1 "granted"
#define HISTORY_USUAL_DECISION_2 "released"
#define HISTORY_UNUSUAL_DECISION \
        "decision NOT IN ('" HISTORY_USUAL_DECISION_1 "', '" HISTORY_USUAL_DECISION_2 "')"

static inline bool history_decision_is_usual(const char *decision) {
        return strcmp(decision, HISTORY_USUAL_DECISION_1) == 0 || strcmp(decision, HISTORY_USUAL_DECISION_2) == 0;
}
