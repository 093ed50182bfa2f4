/* SPDX-License-Identifier: MIT */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "history-file.h"
#include "history-schema.h"
#include "macro.h"
#include "scenario.h"

SqliteApi sqlite_api;

static int sqlite_load(const char *who, char **error) {
        if (sqlite_api.handle)
                return 0;
        void *h = dlopen("libsqlite3.so.0", RTLD_NOW | RTLD_LOCAL);
        if (!h)
                return scenario_error(error, "%s needs libsqlite3.so.0: %s", who, dlerror());
#define SYM(name)                                                                                          \
        if (!(sqlite_api.name = dlsym(h, "sqlite3_" #name))) {                                             \
                dlclose(h);                                                                                \
                return scenario_error(error, "%s: libsqlite3.so.0 lacks sqlite3_%s", who, #name);          \
        }
        SYM(bind_int64);
        SYM(bind_text);
        SYM(close_v2);
        SYM(column_int64);
        SYM(column_text);
        SYM(column_type);
        SYM(errmsg);
        SYM(errstr);
        SYM(exec);
        SYM(finalize);
        SYM(open_v2);
        SYM(prepare_v2);
        SYM(step);
#undef SYM
        sqlite_api.handle = h;
        return 0;
}

/* "file:" URI of a path, read-only: ?, # and % would end or escape the path. */
static int uri_ro(const char *path, bool immutable, char **ret) {
        size_t n = strlen(path);
        char *u = malloc(n * 3 + 32), *p = u;
        if (!u)
                return -ENOMEM;
        p += sprintf(p, "file:");
        for (const char *s = path; *s; s++) {
                if (*s == '?' || *s == '#' || *s == '%')
                        p += sprintf(p, "%%%02X", (unsigned char) *s);
                else
                        *p++ = *s;
        }
        strcpy(p, immutable ? "?mode=ro&immutable=1" : "?mode=ro");
        *ret = u;
        return 0;
}

static int pragma_int(sqlite3 *db, const char *sql, int64_t *ret) {
        sqlite3_stmt *st = NULL;
        int rc = sqlite_api.prepare_v2(db, sql, -1, &st, NULL);
        if (rc == SQLITE_OK) {
                rc = sqlite_api.step(st);
                if (rc == SQLITE_ROW) {
                        *ret = sqlite_api.column_int64(st, 0);
                        rc = SQLITE_OK;
                }
        }
        sqlite_api.finalize(st);
        return rc;
}

/* Before any table is read: another program's file may have an "events" table of its own, and a newer
 * brokerd's schema may mean something else by the columns read here. */
static int check_schema(sqlite3 *db, const char *path, const char *who, char **error) {
        int64_t app = 0, version = 0;
        int rc;

        rc = pragma_int(db, "PRAGMA application_id", &app);
        if (rc == SQLITE_OK)
                rc = pragma_int(db, "PRAGMA user_version", &version);
        if (rc != SQLITE_OK)
                return scenario_error(error, "%s: cannot read '%s': %s", who, path, sqlite_api.errmsg(db));
        if (app != HISTORY_APPLICATION_ID || version < 1)
                return scenario_error(error, "%s: '%s' is not a brokerd history database (application_id %#" PRIx64
                                             ", user_version %" PRId64 ")",
                                      who, path, (uint64_t) (uint32_t) app, version);
        if (version > HISTORY_SCHEMA_VERSION)
                return scenario_error(error, "%s: '%s' was written by a newer brokerd (schema version %" PRId64
                                             "; this slotctl reads versions 1 to %d): read it with that version's slotctl",
                                      who, path, version, HISTORY_SCHEMA_VERSION);
        return 0;
}

int history_file_open(const char *path, const char *who, char **error, sqlite3 **ret) {
        sqlite3 *db = NULL;
        int rc = SQLITE_CANTOPEN;

        int k = sqlite_load(who, error);
        if (k < 0)
                return k;
        /* SQLite's "unable to open database file" does not say why. */
        if (access(path, R_OK) < 0)
                return scenario_error(error, "%s: cannot read '%s': %s", who, path, strerror(errno));
        /* A FIFO would block the open until something writes to it, for ever. */
        struct stat st;
        if (stat(path, &st) < 0)
                return scenario_error(error, "%s: cannot read '%s': %s", who, path, strerror(errno));
        if (!S_ISREG(st.st_mode))
                return scenario_error(error, "%s: '%s' is not a regular file", who, path);
        /* Read-only, never creating it. A WAL database in a directory we may not write, or one that a
         * running brokerd holds (it locks history.db for itself: brokerd(8)), still opens as immutable, its
         * newest rows (not yet checkpointed) then missing. */
        for (int immutable = 0; immutable <= 1 && (rc == SQLITE_CANTOPEN || rc == SQLITE_BUSY); immutable++) {
                _cleanup_free_ char *uri = NULL;
                if (uri_ro(path, immutable, &uri) < 0)
                        return -ENOMEM;
                sqlite_api.close_v2(db);
                db = NULL;
                rc = sqlite_api.open_v2(uri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL);
                if (rc == SQLITE_OK)
                        rc = sqlite_api.exec(db, "SELECT count(*) FROM sqlite_master", NULL, NULL, NULL);
        }
        if (rc != SQLITE_OK) {
                k = scenario_error(error, "%s: cannot read '%s': %s", who, path,
                                   db ? sqlite_api.errmsg(db) : sqlite_api.errstr(rc));
                sqlite_api.close_v2(db);
                return k;
        }
        k = check_schema(db, path, who, error);
        if (k < 0) {
                sqlite_api.close_v2(db);
                return k;
        }
        *ret = db;
        return 0;
}
