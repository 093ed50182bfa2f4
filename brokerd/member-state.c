/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "conf.h"
#include "fs-util.h"
#include "member-state.h"

#define HEADER_NAME "members"
#define VERSION 1
#define FILE_MAX (64 * 1024 * 1024)

void member_state_entry_done(MemberStateEntry *e) {
        free(e->pool);
        free(e->member);
        free(e->drain_by);
        free(e->drain_reason);
        free(e->quarantine_job);
        free(e->quarantine_reason);
}

void member_state_entries_free(MemberStateEntry *e, size_t n) {
        for (size_t i = 0; e && i < n; i++)
                member_state_entry_done(e + i);
        free(e);
}

bool member_state_text_is_valid(const char *s) {
        if (!s || !*s || strlen(s) > MEMBER_STATE_REASON_MAX)
                return false;
        for (const unsigned char *p = (const unsigned char *) s; *p; p++)
                if (*p < 0x20 || *p == 0x7f)
                        return false;
        return true;
}

static char *path_in(const char *directory, const char *name) {
        char *p;
        return asprintf(&p, "%s/%s", directory, name) < 0 ? NULL : p;
}

/* ---- reading: everything checked, or nothing used ---- */

static int get_time(json_t *o, const char *key, bool optional, usec_t *ret) {
        json_t *v = json_object_get(o, key);
        if (!v && optional) {
                *ret = USEC_INFINITY;
                return 0;
        }
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (json_int_t) (USEC_INFINITY / 2))
                return -EBADMSG;
        *ret = (usec_t) json_integer_value(v);
        return 0;
}

static int get_text(json_t *o, const char *key, char **ret) {
        json_t *v = json_object_get(o, key);
        if (!v) {
                *ret = NULL;
                return 0;
        }
        if (!json_is_string(v) || !member_state_text_is_valid(json_string_value(v)))
                return -EBADMSG;
        /* A C1 character or U+2028/U+2029 is no damage: a brokerd before the quarantine's job label was mapped
         * through conf_text_sanitize() kept them, and so did one before a reason refused them. They are mapped
         * as such a brokerd maps them now: what is shown, journaled and written back is one line. */
        *ret = conf_text_sanitize(strdup(json_string_value(v)));
        return *ret ? 0 : -ENOMEM;
}

static bool only_keys(json_t *o, const char *const *keys) {
        const char *k;
        json_t *v;
        json_object_foreach(o, k, v) {
                bool known = false;
                for (const char *const *i = keys; *i && !known; i++)
                        known = streq(*i, k);
                if (!known)
                        return false;
        }
        return true;
}

static int entry_from_json(json_t *o, MemberStateEntry *e) {
        static const char *const entry_keys[] = { "pool", "member", "drain", "quarantine", NULL };
        static const char *const drain_keys[] = { "since", "until", "by", "reason", NULL };
        static const char *const quarantine_keys[] = { "since", "job", "exitStatus", "reason", NULL };
        int r;

        *e = (MemberStateEntry) { .drain_until = USEC_INFINITY, .quarantine_exit_status = -1 };
        if (!json_is_object(o) || !only_keys(o, entry_keys))
                return -EBADMSG;
        json_t *pool = json_object_get(o, "pool"), *member = json_object_get(o, "member");
        json_t *d = json_object_get(o, "drain"), *q = json_object_get(o, "quarantine");
        if (!json_is_string(pool) || !conf_name_is_valid(json_string_value(pool)) ||
            (member && (!json_is_string(member) || !conf_name_is_valid(json_string_value(member)))) ||
            (!d && !q) || (q && !member))
                return -EBADMSG;
        e->pool = strdup(json_string_value(pool));
        e->member = member ? strdup(json_string_value(member)) : NULL;
        if (!e->pool || (member && !e->member))
                return -ENOMEM;
        if (d) {
                if (!json_is_object(d) || !only_keys(d, drain_keys))
                        return -EBADMSG;
                e->drained = true;
                if ((r = get_time(d, "since", false, &e->drain_since)) < 0 ||
                    (r = get_time(d, "until", true, &e->drain_until)) < 0 || (r = get_text(d, "by", &e->drain_by)) < 0 ||
                    (r = get_text(d, "reason", &e->drain_reason)) < 0)
                        return r;
        }
        if (q) {
                if (!json_is_object(q) || !only_keys(q, quarantine_keys))
                        return -EBADMSG;
                e->quarantined = true;
                json_t *st = json_object_get(q, "exitStatus");
                if (st && (!json_is_integer(st) || json_integer_value(st) < 0 || json_integer_value(st) > 255))
                        return -EBADMSG;
                e->quarantine_exit_status = st ? (int) json_integer_value(st) : -1;
                if ((r = get_time(q, "since", false, &e->quarantine_since)) < 0 ||
                    (r = get_text(q, "job", &e->quarantine_job)) < 0 || (r = get_text(q, "reason", &e->quarantine_reason)) < 0)
                        return r;
        }
        return 0;
}

int member_state_read(const char *directory, MemberStateEntry **ret, size_t *ret_n) {
        _cleanup_free_ char *path = path_in(directory, MEMBER_STATE_FILE);
        if (!path)
                return -ENOMEM;
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0) {
                if (errno != ENOENT)
                        return -errno;
                *ret = NULL;
                *ret_n = 0;
                return 0;
        }
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode) || st.st_size > FILE_MAX)
                return -EBADMSG;
        json_error_t err;
        _cleanup_(json_decrefp) json_t *root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &err);
        if (!root)
                return -EBADMSG;
        json_t *entries = json_object_get(root, "entries");
        if (!json_is_object(root) || !streq_ptr(json_string_value(json_object_get(root, "slotbroker")), HEADER_NAME) ||
            !json_is_integer(json_object_get(root, "version")) ||
            json_integer_value(json_object_get(root, "version")) != VERSION || !json_is_array(entries) ||
            json_array_size(entries) > MEMBER_STATE_ENTRIES_MAX ||
            !only_keys(root, (const char *const[]) { "slotbroker", "version", "entries", NULL }))
                return -EBADMSG;
        size_t n = json_array_size(entries);
        MemberStateEntry *e = calloc(n ?: 1, sizeof(MemberStateEntry));
        if (!e)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                int r = entry_from_json(json_array_get(entries, i), &e[i]);
                if (r < 0) {
                        member_state_entries_free(e, i + 1);
                        return r;
                }
        }
        *ret = e;
        *ret_n = n;
        return 0;
}

/* ---- writing ---- */

static json_t *entry_to_json(const MemberStateEntry *e) {
        json_t *o = json_pack("{s:s, s:s*}", "pool", e->pool, "member", e->member);
        if (!o)
                return NULL;
        if (e->drained) {
                json_t *d = json_pack("{s:I, s:s*, s:s*}", "since", (json_int_t) e->drain_since, "by", e->drain_by,
                                      "reason", e->drain_reason);
                if (d && e->drain_until != USEC_INFINITY)
                        json_object_set_new(d, "until", json_integer((json_int_t) e->drain_until));
                if (!d || json_object_set_new(o, "drain", d) < 0)
                        return json_decref(o), NULL;
        }
        if (e->quarantined) {
                json_t *q = json_pack("{s:I, s:s*, s:s*}", "since", (json_int_t) e->quarantine_since, "job",
                                      e->quarantine_job, "reason", e->quarantine_reason);
                if (q && e->quarantine_exit_status >= 0)
                        json_object_set_new(q, "exitStatus", json_integer(e->quarantine_exit_status));
                if (!q || json_object_set_new(o, "quarantine", q) < 0)
                        return json_decref(o), NULL;
        }
        return o;
}

int member_state_write(const char *directory, const MemberStateEntry *e, size_t n) {
        _cleanup_(json_decrefp) json_t *root = json_pack("{s:s, s:i, s:[]}", "slotbroker", HEADER_NAME, "version", VERSION,
                                                         "entries");
        if (!root)
                return -ENOMEM;
        json_t *entries = json_object_get(root, "entries");
        for (size_t i = 0; i < n; i++) {
                json_t *o = entry_to_json(&e[i]);
                if (!o || json_array_append_new(entries, o) < 0)
                        return -ENOMEM;
        }
        _cleanup_free_ char *text = json_dumps(root, JSON_COMPACT);
        _cleanup_free_ char *path = path_in(directory, MEMBER_STATE_FILE);
        _cleanup_free_ char *tmp = path_in(directory, MEMBER_STATE_FILE ".tmp");
        if (!text || !path || !tmp)
                return -ENOMEM;
        _cleanup_close_ int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, 0600);
        if (fd < 0)
                return -errno;
        int r = fd_write_all(fd, text, strlen(text));
        if (r == 0 && fd_write_all(fd, "\n", 1) < 0)
                r = -EIO;
        /* No fsync: as the lease log, the page cache survives a crash of brokerd; a rename over the old file
         * keeps one whole version either way. */
        if (r == 0 && rename(tmp, path) < 0)
                r = -errno;
        if (r < 0)
                (void) unlink(tmp);
        return r;
}

int member_state_move_aside(const char *directory, char **ret_moved) {
        _cleanup_free_ char *path = path_in(directory, MEMBER_STATE_FILE);
        if (!path)
                return -ENOMEM;
        return rename_aside(path, /* missing_ok= */ false, ret_moved);
}
