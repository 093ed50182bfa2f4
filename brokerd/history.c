/* SPDX-License-Identifier: MIT */
/* history.c — owns the types of history.h and history-internal.h: the helpers of the state a restart reads
 * (HistoryState, its lease rows and token marks) and the writer's timings. The rooms (history-*.c) use them
 * and they use no room: kept in a room, they had that room and the ones below it call each other. */
#include <stdlib.h>

#include "history-internal.h"

HistoryTuning history_tuning = {
        .flush_delay = 100 * USEC_PER_MSEC,
        .reopen_interval = 5 * USEC_PER_SEC,
        .retention_interval = USEC_PER_MINUTE,
        .retry_min = 100 * USEC_PER_MSEC,
        .retry_max = 5 * USEC_PER_SEC,
        .stop_timeout = 3 * USEC_PER_SEC,
};

void history_members_free(char **members, unsigned n) {
        for (unsigned i = 0; members && i < n; i++)
                free(members[i]);
        free(members);
}

void history_lease_row_done(HistoryLeaseRow *row) {
        if (!row)
                return;
        free(row->id);
        free(row->pool);
        free(row->lane);
        free(row->slots);
        history_members_free(row->members, row->n_slots);
        free(row->job);
        free(row->remote_id);
        free(row->backend.url);
        free(row->backend.user);
        free(row->backend.password_file);
        free(row->backend.sentinel_password_file);
        for (size_t i = 0; i < row->n_also; i++) {
                free(row->also[i].pool);
                free(row->also[i].remote_id);
                free(row->also[i].slots);
                history_members_free(row->also[i].members, row->also[i].n_slots);
        }
        free(row->also);
        *row = (HistoryLeaseRow) {};
}

void history_lease_rows_free(HistoryLeaseRow *rows, size_t n) {
        for (size_t i = 0; i < n; i++)
                history_lease_row_done(&rows[i]);
        free(rows);
}

void history_token_floors_free(HistoryTokenFloor *floors, size_t n) {
        for (size_t i = 0; i < n; i++)
                free(floors[i].pool);
        free(floors);
}

void history_state_done(HistoryState *s) {
        if (!s)
                return;
        history_lease_rows_free(s->leases, s->n_leases);
        history_token_floors_free(s->floors, s->n_floors);
        *s = (HistoryState) {};
}
