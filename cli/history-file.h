/* SPDX-License-Identifier: MIT */
/* history-file.h — brokerd's history.db as slotctl reads it (simulate --replay, report): libsqlite3 loaded
 * on demand, the file opened read-only, and told from any other SQLite file before a table is read. */
#pragma once

#include <sqlite3.h>

/* libsqlite3 is loaded when a verb reads a history, not linked: every other verb, `slotctl run` first, then
 * starts without mapping and relocating it and the libm it pulls in (a third of slotctl's start-up). The
 * header still gives the types and constants; the functions come from this table, which
 * history_file_open() fills. */
typedef struct SqliteApi {
        void *handle;
        __typeof__(sqlite3_bind_int64) *bind_int64;
        __typeof__(sqlite3_bind_text) *bind_text;
        __typeof__(sqlite3_close_v2) *close_v2;
        __typeof__(sqlite3_column_int64) *column_int64;
        __typeof__(sqlite3_column_text) *column_text;
        __typeof__(sqlite3_column_type) *column_type;
        __typeof__(sqlite3_errmsg) *errmsg;
        __typeof__(sqlite3_errstr) *errstr;
        __typeof__(sqlite3_exec) *exec;
        __typeof__(sqlite3_finalize) *finalize;
        __typeof__(sqlite3_open_v2) *open_v2;
        __typeof__(sqlite3_prepare_v2) *prepare_v2;
        __typeof__(sqlite3_step) *step;
} SqliteApi;

extern SqliteApi sqlite_api;

/* Opens path read-only (never creating it; a WAL database that a running brokerd holds, or in a directory
 * we may not write, as immutable) and checks its application_id and user_version: a file of another
 * program, or of a newer brokerd's schema, is refused before any table is read. who prefixes the messages
 * ("--replay", "report"). Returns 0 and the connection in *ret (close it with sqlite_api.close_v2()); -EINVAL
 * with *error set (no such file, unreadable, not a history, newer schema); -ENOMEM. */
int history_file_open(const char *path, const char *who, char **error, sqlite3 **ret);
