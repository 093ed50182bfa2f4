/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <assert.h>
#include <limits.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "conf.h"
#include "fs-util.h"
#include "lease-log.h"

#define LEASE_LOG_HEADER "{\"slotbroker\":\"leases\",\"version\":1}"
#define LEASE_LOG_MAX_SIZE ((size_t) 256 * 1024 * 1024)
/* Reserved past the end of the file (fallocate), and topped up when less than half of it is left. */
#define LEASE_LOG_RESERVE ((off_t) 1024 * 1024)
/* A log is rewritten once it has this many lines more than 4 per live lease. */
#define LEASE_LOG_REWRITE_SLACK 4096

typedef struct TokenMark {
        char *pool;
        uint64_t next;
} TokenMark;

typedef struct Buffer {
        char *data;
        size_t size, allocated;
} Buffer;

struct LeaseLog {
        char *directory;
        char *path;
        int fd;
        off_t size;             /* what was written and counts */
        off_t reserved_to;      /* fallocate()d up to here */
        Buffer pending;
        size_t lines;           /* lines in the file, for lease_log_wants_rewrite() */
        size_t pending_lines;
        bool broken;
        TokenMark *marks;
        size_t n_marks;
        LeaseLogRest *rests;    /* for snapshots: the rests written, until they end */
        size_t n_rests;
        LeaseLogUse *uses;      /* for snapshots: every member's last counts */
        size_t n_uses;
};

/* ---- CRC-32 (zlib's polynomial, so that a test or an operator can check a line with zlib.crc32) ---- */

/* Eight tables, eight bytes a step ("slicing-by-8"): a lease line's CRC was 2% of bench-pairs' brokerd
 * CPU a byte at a time. */
static uint32_t crc_table[8][256];

static void crc_table_init(void) {
        for (uint32_t i = 0; i < 256; i++) {
                uint32_t c = i;
                for (int k = 0; k < 8; k++)
                        c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
                crc_table[0][i] = c;
        }
        for (uint32_t i = 0; i < 256; i++)
                for (int t = 1; t < 8; t++)
                        crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc32_of(const char *data, size_t size) {
        const uint8_t *p = (const uint8_t *) data;
        uint32_t c = 0xFFFFFFFFu;

        if (crc_table[0][1] == 0)
                crc_table_init();
        for (; size >= 8; p += 8, size -= 8) {
                uint32_t lo = c ^ ((uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 | (uint32_t) p[3] << 24);
                uint32_t hi = (uint32_t) p[4] | (uint32_t) p[5] << 8 | (uint32_t) p[6] << 16 | (uint32_t) p[7] << 24;
                c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^ crc_table[5][(lo >> 16) & 0xFF] ^
                    crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
                    crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        }
        for (; size > 0; p++, size--)
                c = crc_table[0][(c ^ *p) & 0xFF] ^ (c >> 8);
        return c ^ 0xFFFFFFFFu;
}

/* ---- lines ---- */

static int buffer_reserve(Buffer *b, size_t more) {
        if (b->size + more <= b->allocated)
                return 0;
        size_t n = MAX(b->allocated * 2, b->size + more + 256);
        char *d = realloc(b->data, n);
        if (!d)
                return -ENOMEM;
        b->data = d;
        b->allocated = n;
        return 0;
}

static int buffer_put(Buffer *b, const char *s, size_t n) {
        if (buffer_reserve(b, n) < 0)
                return -ENOMEM;
        memcpy(b->data + b->size, s, n);
        b->size += n;
        return 0;
}

static int buffer_puts(Buffer *b, const char *s) {
        return buffer_put(b, s, strlen(s));
}

/* A decimal number: snprintf() per number was about 1% of bench-pairs' brokerd CPU. */
static int buffer_put_u64(Buffer *b, uint64_t v) {
        char tmp[20];
        size_t n = 0;
        do
                tmp[sizeof tmp - ++n] = (char) ('0' + v % 10);
        while ((v /= 10) > 0);
        return buffer_put(b, tmp + sizeof tmp - n, n);
}

static int buffer_put_i64(Buffer *b, int64_t v) {
        if (v >= 0)
                return buffer_put_u64(b, (uint64_t) v);
        return buffer_put(b, "-", 1) ?: buffer_put_u64(b, -(uint64_t) v);
}

/* A key (with its quotes, its colon and the comma before it), then a number. */
static int buffer_put_field_u64(Buffer *b, const char *key, uint64_t v) {
        return buffer_puts(b, key) ?: buffer_put_u64(b, v);
}

/* A JSON string. What is written here came through the protocol's JSON parser or the configuration: valid
 * UTF-8, so escaping '"', '\\' and the control characters is all it takes. */
static int buffer_put_string(Buffer *b, const char *s) {
        if (buffer_reserve(b, strlen(s) * 6 + 2) < 0)
                return -ENOMEM;
        char *o = b->data + b->size;
        *o++ = '"';
        for (const unsigned char *p = (const unsigned char *) s; *p; p++) {
                if (*p == '"' || *p == '\\') {
                        *o++ = '\\';
                        *o++ = (char) *p;
                } else if (*p < 0x20) {
                        memcpy(o, "\\u00", 4);
                        o[4] = "0123456789abcdef"[*p >> 4];
                        o[5] = "0123456789abcdef"[*p & 15];
                        o += 6;
                } else
                        *o++ = (char) *p;
        }
        *o++ = '"';
        b->size = (size_t) (o - b->data);
        return 0;
}

/* Starts a line: room for its CRC, filled in by line_end(). */
static size_t line_begin(Buffer *b) {
        size_t start = b->size;
        if (buffer_put(b, "00000000 ", 9) < 0)
                return SIZE_MAX;
        return start;
}

static int line_end(Buffer *b, size_t start, int r) {
        if (start == SIZE_MAX || r < 0 || buffer_reserve(b, 1) < 0) {
                if (start != SIZE_MAX)
                        b->size = start;
                return -ENOMEM;
        }
        uint32_t crc = crc32_of(b->data + start + 9, b->size - start - 9);
        for (int i = 7; i >= 0; i--, crc >>= 4)
                b->data[start + (size_t) i] = "0123456789abcdef"[crc & 15];
        b->data[b->size++] = '\n';
        return 0;
}

static int line_literal(Buffer *b, const char *json) {
        size_t start = line_begin(b);
        return line_end(b, start, start == SIZE_MAX ? -ENOMEM : buffer_puts(b, json));
}

/* ,"slots":[…] and, in a pool of members, ,"members":[…] (null for a slot without one): a lease's, and each
 * of its further pools'. */
static int buffer_put_slots(Buffer *b, const unsigned *slots, char *const *members, unsigned n) {
        int r = buffer_puts(b, ",\"slots\":[");
        for (unsigned i = 0; r == 0 && i < n; i++)
                r = (i ? buffer_puts(b, ",") : 0) ?: buffer_put_u64(b, slots[i]);
        r = r ?: buffer_puts(b, "]");
        if (!members)
                return r;
        r = r ?: buffer_puts(b, ",\"members\":[");
        for (unsigned i = 0; r == 0 && i < n; i++) {
                r = i ? buffer_puts(b, ",") : 0;
                r = r ?: members[i] ? buffer_put_string(b, members[i]) : buffer_puts(b, "null");
        }
        return r ?: buffer_puts(b, "]");
}

static int line_lease(Buffer *b, const HistoryLeaseRow *row) {
        size_t start = line_begin(b);
        int r = start == SIZE_MAX ? -ENOMEM : 0;
        r = r ?: buffer_puts(b, "{\"lease\":{\"id\":");
        r = r ?: buffer_put_string(b, row->id);
        r = r ?: buffer_puts(b, ",\"pool\":");
        r = r ?: buffer_put_string(b, row->pool);
        r = r ?: buffer_puts(b, ",\"lane\":");
        r = r ?: buffer_put_string(b, row->lane);
        r = r ?: buffer_put_slots(b, row->slots, row->members, row->n_slots);
        r = r ?: buffer_put_field_u64(b, ",\"token\":", row->token);
        if (row->job) {
                r = r ?: buffer_puts(b, ",\"job\":");
                r = r ?: buffer_put_string(b, row->job);
        }
        r = r ?: buffer_put_field_u64(b, ",\"uid\":", row->uid);
        r = r ?: buffer_puts(b, ",\"pid\":") ?: buffer_put_i64(b, row->pid);
        if (row->command_pid > 0) {
                r = r ?: buffer_puts(b, ",\"commandPid\":") ?: buffer_put_i64(b, row->command_pid);
                r = r ?: buffer_put_field_u64(b, ",\"commandStart\":", row->command_start_time);
        }
        r = r ?: buffer_puts(b, row->detached ? ",\"detached\":true" : ",\"detached\":false");
        /* Only a health job's: a line without it is an ordinary lease's (or one from before, whose lane says). */
        if (row->health_known && row->health)
                r = r ?: buffer_puts(b, ",\"health\":true");
        if (row->quarantine_after > 0) {
                /* Its pool's rules: a restart whose configuration no longer has the pool judges the exit by them. */
                r = r ?: buffer_puts(b, ",\"quarantine\":{\"exitCodes\":[");
                for (unsigned s = 1, n = 0; r == 0 && s <= 255; s++)
                        if ((row->quarantine_exit_codes[s / 64] >> (s % 64)) & 1)
                                r = (n++ ? buffer_puts(b, ",") : 0) ?: buffer_put_u64(b, s);
                r = r ?: buffer_put_field_u64(b, "],\"after\":", row->quarantine_after);
                r = r ?: buffer_puts(b, "}");
        }
        r = r ?: buffer_put_field_u64(b, ",\"grantedAt\":", row->granted_at);
        if (row->expires_at != USEC_INFINITY)
                r = r ?: buffer_put_field_u64(b, ",\"expiresAt\":", row->expires_at);
        if (row->remote_id) {
                r = r ?: buffer_puts(b, ",\"remote\":");
                r = r ?: buffer_put_string(b, row->remote_id);
        }
        if (row->n_also > 0) {
                /* An all-or-nothing lease's further pools (SPEC §3.5): restored with it, or not at all. */
                r = r ?: buffer_puts(b, ",\"also\":[");
                for (size_t i = 0; r == 0 && i < row->n_also; i++) {
                        const HistoryLeaseAlso *a = row->also + i;
                        r = i ? buffer_puts(b, ",") : 0;
                        r = r ?: buffer_puts(b, "{\"pool\":") ?: buffer_put_string(b, a->pool);
                        r = r ?: buffer_put_field_u64(b, ",\"token\":", a->token);
                        r = r ?: buffer_put_slots(b, a->slots, a->members, a->n_slots);
                        if (a->remote_id) /* a shared pool's share: reclaimed by this name after a restart */
                                r = r ?: buffer_puts(b, ",\"remote\":") ?: buffer_put_string(b, a->remote_id);
                        r = r ?: buffer_puts(b, "}");
                }
                r = r ?: buffer_puts(b, "]");
        }
        if (row->remote_id && row->backend.url) {
                const HistoryLeaseBackend *k = &row->backend;
                r = r ?: buffer_puts(b, ",\"backend\":{\"url\":") ?: buffer_put_string(b, k->url);
                if (k->user)
                        r = r ?: buffer_puts(b, ",\"user\":") ?: buffer_put_string(b, k->user);
                if (k->password_file)
                        r = r ?: buffer_puts(b, ",\"passwordFile\":") ?: buffer_put_string(b, k->password_file);
                if (k->sentinel_password_file)
                        r = r ?: buffer_puts(b, ",\"sentinelPasswordFile\":") ?:
                                  buffer_put_string(b, k->sentinel_password_file);
                r = r ?: buffer_put_field_u64(b, ",\"nodeTtl\":", k->node_ttl);
                r = r ?: buffer_puts(b, "}");
        }
        r = r ?: buffer_puts(b, "}}");
        return line_end(b, start, r);
}

static int line_end_of(Buffer *b, const char *id) {
        size_t start = line_begin(b);
        int r = start == SIZE_MAX ? -ENOMEM : 0;
        r = r ?: buffer_puts(b, "{\"end\":");
        r = r ?: buffer_put_string(b, id);
        r = r ?: buffer_puts(b, "}");
        return line_end(b, start, r);
}

static int line_token(Buffer *b, const TokenMark *m) {
        size_t start = line_begin(b);
        int r = start == SIZE_MAX ? -ENOMEM : 0;
        r = r ?: buffer_puts(b, "{\"token\":{\"pool\":");
        r = r ?: buffer_put_string(b, m->pool);
        r = r ?: buffer_put_field_u64(b, ",\"next\":", m->next);
        r = r ?: buffer_puts(b, "}}");
        return line_end(b, start, r);
}

static int line_alive(Buffer *b, usec_t realtime) {
        size_t start = line_begin(b);
        int r = start == SIZE_MAX ? -ENOMEM : 0;
        r = r ?: buffer_put_field_u64(b, "{\"alive\":", realtime);
        r = r ?: buffer_puts(b, "}");
        return line_end(b, start, r);
}

static int line_rest(Buffer *b, const LeaseLogRest *rs) {
        size_t start = line_begin(b);
        int r = start == SIZE_MAX ? -ENOMEM : 0;
        r = r ?: buffer_puts(b, "{\"rest\":{\"pool\":");
        r = r ?: buffer_put_string(b, rs->pool);
        r = r ?: buffer_put_field_u64(b, ",\"slot\":", rs->slot);
        if (rs->member) {
                r = r ?: buffer_puts(b, ",\"member\":");
                r = r ?: buffer_put_string(b, rs->member);
        }
        r = r ?: buffer_put_field_u64(b, ",\"until\":", rs->until);
        r = r ?: buffer_puts(b, "}}");
        return line_end(b, start, r);
}

static int line_use(Buffer *b, const LeaseLogUse *u) {
        size_t start = line_begin(b);
        int r = start == SIZE_MAX ? -ENOMEM : 0;
        r = r ?: buffer_puts(b, "{\"use\":{\"pool\":");
        r = r ?: buffer_put_string(b, u->pool);
        r = r ?: buffer_puts(b, ",\"member\":");
        r = r ?: buffer_put_string(b, u->member);
        r = r ?: buffer_put_field_u64(b, ",\"grants\":", u->grants);
        r = r ?: buffer_put_field_u64(b, ",\"heldUs\":", u->held);
        r = r ?: buffer_put_field_u64(b, ",\"quarantines\":", u->quarantines);
        r = r ?: buffer_put_field_u64(b, ",\"failures\":", u->failures);
        r = r ?: buffer_puts(b, "}}");
        return line_end(b, start, r);
}

/* ---- members' counts ---- */

static void uses_free(LeaseLogUse *uses, size_t n) {
        for (size_t i = 0; i < n; i++) {
                free(uses[i].pool);
                free(uses[i].member);
        }
        free(uses);
}

/* Sets a member's counts, replacing those recorded before. */
/* *ret = u with its own copies of the names; *ret untouched on failure. */
static int use_copy(const LeaseLogUse *u, LeaseLogUse *ret) {
        LeaseLogUse c = *u;
        c.pool = strdup(u->pool);
        c.member = strdup(u->member);
        if (!c.pool || !c.member) {
                free(c.pool);
                free(c.member);
                return -ENOMEM;
        }
        *ret = c;
        return 0;
}

static int uses_set(LeaseLogUse **uses, size_t *n, const LeaseLogUse *u) {
        for (size_t i = 0; i < *n; i++) {
                LeaseLogUse *o = &(*uses)[i];
                if (streq(o->pool, u->pool) && streq(o->member, u->member)) {
                        o->grants = u->grants;
                        o->held = u->held;
                        o->quarantines = u->quarantines;
                        o->failures = u->failures;
                        return 0;
                }
        }
        LeaseLogUse *a = reallocarray(*uses, *n + 1, sizeof(LeaseLogUse));
        if (!a)
                return -ENOMEM;
        *uses = a;
        int r = use_copy(u, &a[*n]);
        if (r < 0)
                return r;
        (*n)++;
        return 0;
}

/* A start reads every "use" line there is (a member's every grant and release since the last snapshot): appended
 * here, then made one per member by uses_dedupe(), which keeps each member's last. A search per line made a
 * read of 10,000 members' lines quadratic (0.65 s of a start, bench-member-counts.py). */
static int uses_append(LeaseLogUse **uses, size_t *n, size_t *allocated, const LeaseLogUse *u) {
        if (*n == *allocated) {
                size_t k = MAX(*allocated * 2, (size_t) 16);
                LeaseLogUse *a = reallocarray(*uses, k, sizeof(LeaseLogUse));
                if (!a)
                        return -ENOMEM;
                *uses = a;
                *allocated = k;
        }
        int r = use_copy(u, &(*uses)[*n]);
        if (r < 0)
                return r;
        (*n)++;
        return 0;
}

typedef struct UseOrder {
        LeaseLogUse u;
        size_t seq;             /* its line's place: the last one of a member wins */
} UseOrder;

static int use_order_compare(const void *a, const void *b) {
        const UseOrder *x = a, *y = b;
        int c = strcmp(x->u.pool, y->u.pool);
        c = c ?: strcmp(x->u.member, y->u.member);
        return c ?: (x->seq > y->seq) - (x->seq < y->seq);
}

/* One record per member, its last, in (pool, member) order. Returns 0 or -ENOMEM (nothing changed). */
static int uses_dedupe(LeaseLogUse *uses, size_t *n) {
        if (*n < 2)
                return 0;
        _cleanup_free_ UseOrder *o = calloc(*n, sizeof(UseOrder));
        if (!o)
                return -ENOMEM;
        for (size_t i = 0; i < *n; i++)
                o[i] = (UseOrder) { .u = uses[i], .seq = i };
        qsort(o, *n, sizeof(UseOrder), use_order_compare);
        size_t k = 0;
        for (size_t i = 0; i < *n; i++) {
                bool last = i + 1 == *n || !streq(o[i].u.pool, o[i + 1].u.pool) || !streq(o[i].u.member, o[i + 1].u.member);
                if (last)
                        uses[k++] = o[i].u;
                else {
                        free(o[i].u.pool);
                        free(o[i].u.member);
                }
        }
        *n = k;
        return 0;
}

/* ---- rests (cooldown=) ---- */

static void rests_free(LeaseLogRest *rests, size_t n) {
        for (size_t i = 0; i < n; i++) {
                free(rests[i].pool);
                free(rests[i].member);
        }
        free(rests);
}

void lease_log_read_done(LeaseLogRead *info) {
        if (!info)
                return;
        rests_free(info->rests, info->n_rests);
        info->rests = NULL;
        info->n_rests = 0;
        uses_free(info->uses, info->n_uses);
        info->uses = NULL;
        info->n_uses = 0;
        info->damage = mfree(info->damage);
        info->damage_size = 0;
}

/* Sets the rest of a slot (pool, and member if it has one, else index), replacing one recorded before. */
static int rests_set(LeaseLogRest **rests, size_t *n, const char *pool, unsigned slot, const char *member, usec_t until) {
        for (size_t i = 0; i < *n; i++) {
                LeaseLogRest *rs = &(*rests)[i];
                if (streq(rs->pool, pool) && (member ? streq_ptr(rs->member, member) : !rs->member && rs->slot == slot)) {
                        rs->slot = slot;
                        rs->until = until;
                        return 0;
                }
        }
        LeaseLogRest *a = reallocarray(*rests, *n + 1, sizeof(LeaseLogRest));
        if (!a)
                return -ENOMEM;
        *rests = a;
        LeaseLogRest rs = { .pool = strdup(pool), .slot = slot, .member = member ? strdup(member) : NULL, .until = until };
        if (!rs.pool || (member && !rs.member)) {
                free(rs.pool);
                free(rs.member);
                return -ENOMEM;
        }
        a[(*n)++] = rs;
        return 0;
}

/* ---- token marks ---- */

static TokenMark *marks_find(TokenMark *marks, size_t n, const char *pool) {
        for (size_t i = 0; i < n; i++)
                if (streq(marks[i].pool, pool))
                        return &marks[i];
        return NULL;
}

static int marks_raise(TokenMark **marks, size_t *n, const char *pool, uint64_t next) {
        TokenMark *m = marks_find(*marks, *n, pool);
        if (m) {
                m->next = MAX(m->next, next);
                return 0;
        }
        TokenMark *a = reallocarray(*marks, *n + 1, sizeof(TokenMark));
        if (!a)
                return -ENOMEM;
        *marks = a;
        char *p = strdup(pool);
        if (!p)
                return -ENOMEM;
        a[(*n)++] = (TokenMark) { .pool = p, .next = next };
        return 0;
}

static void marks_free(TokenMark *marks, size_t n) {
        for (size_t i = 0; i < n; i++)
                free(marks[i].pool);
        free(marks);
}

/* ---- reading ---- */

/* The live leases read so far, and an index of them by id: every lease line drops an older line of the
 * same lease and every "end" drops its lease, and a scan of the list for each made a start-up read
 * quadratic (release build, 10,000 live leases in 15,000 lines: 337 ms, now 71 ms, mostly the JSON
 * parser; 20,000 in 30,000: 1.65 s, now 142 ms). The index is open addressing with linear probing, at
 * most half full: position + 1 in leases, 0 for an empty slot; a removal shifts back the entries after
 * it instead of leaving a tombstone. */
typedef struct Reader {
        HistoryLeaseRow *leases;
        size_t n_leases, allocated;
        size_t *index;
        size_t index_size;      /* a power of two, or 0 before the first lease */
        TokenMark *marks;
        size_t n_marks;
        usec_t alive_at;
        LeaseLogRest *rests;
        size_t n_rests;
        LeaseLogUse *uses;      /* every "use" line read, uses_dedupe()d at the end */
        size_t n_uses, uses_allocated;
        unsigned damaged;       /* lines that did not check out since the last "reset" */
        Buffer damage;          /* their bytes, up to LEASE_LOG_DAMAGE_KEEP */
} Reader;

static void reader_done(Reader *rd) {
        history_lease_rows_free(rd->leases, rd->n_leases);
        free(rd->index);
        marks_free(rd->marks, rd->n_marks);
        rests_free(rd->rests, rd->n_rests);
        uses_free(rd->uses, rd->n_uses);
        free(rd->damage.data);
}

/* FNV-1a: lease ids are brokerd's own (random hex), nothing chosen to collide. */
static size_t id_hash(const char *id) {
        uint64_t h = 0xcbf29ce484222325u;
        for (; *id; id++)
                h = (h ^ (uint8_t) *id) * 0x100000001b3u;
        return (size_t) h;
}

/* The slot of the index that holds id, or the empty slot where it would go. */
static size_t reader_slot(const Reader *rd, const char *id) {
        size_t mask = rd->index_size - 1;
        for (size_t i = id_hash(id) & mask;; i = (i + 1) & mask)
                if (rd->index[i] == 0 || streq(rd->leases[rd->index[i] - 1].id, id))
                        return i;
}

static int reader_index_grow(Reader *rd) {
        size_t size = MAX(rd->index_size * 2, (size_t) 64);
        size_t *index = calloc(size, sizeof(size_t));
        if (!index)
                return -ENOMEM;
        free(rd->index);
        rd->index = index;
        rd->index_size = size;
        for (size_t i = 0; i < rd->n_leases; i++)
                rd->index[reader_slot(rd, rd->leases[i].id)] = i + 1;
        return 0;
}

static void reader_forget(Reader *rd, const char *id) {
        if (rd->n_leases == 0)
                return;
        size_t mask = rd->index_size - 1, hole = reader_slot(rd, id);
        if (rd->index[hole] == 0)
                return;
        size_t at = rd->index[hole] - 1;
        /* An entry after the hole moves into it unless its home slot lies between the hole and it. */
        for (size_t i = (hole + 1) & mask; rd->index[i] != 0; i = (i + 1) & mask) {
                size_t home = id_hash(rd->leases[rd->index[i] - 1].id) & mask;
                if (((i - home) & mask) >= ((i - hole) & mask)) {
                        rd->index[hole] = rd->index[i];
                        hole = i;
                }
        }
        rd->index[hole] = 0;
        history_lease_row_done(&rd->leases[at]);
        /* The last lease takes the freed place: the order of the leases read is no promise. */
        if (at != --rd->n_leases) {
                rd->leases[at] = rd->leases[rd->n_leases];
                rd->index[reader_slot(rd, rd->leases[at].id)] = at + 1;
        }
}

static int reader_leases_grow(Reader *rd) {
        size_t n = MAX(rd->allocated * 2, (size_t) 16);
        HistoryLeaseRow *a = reallocarray(rd->leases, n, sizeof(HistoryLeaseRow));
        if (!a)
                return -ENOMEM;
        rd->leases = a;
        rd->allocated = n;
        return 0;
}

/* Takes row (freed on failure too). Returns 0 or -ENOMEM. */
static int reader_add(Reader *rd, HistoryLeaseRow *row) {
        int r;

        reader_forget(rd, row->id); /* a lease written again (a snapshot) replaces its old line */
        r = marks_raise(&rd->marks, &rd->n_marks, row->pool, row->token + 1);
        for (size_t i = 0; r == 0 && i < row->n_also; i++)
                r = marks_raise(&rd->marks, &rd->n_marks, row->also[i].pool, row->also[i].token + 1);
        if (r == 0 && rd->n_leases == rd->allocated)
                r = reader_leases_grow(rd);
        if (r == 0 && (rd->n_leases + 1) * 2 > rd->index_size)
                r = reader_index_grow(rd);
        if (r < 0) {
                history_lease_row_done(row);
                return r;
        }
        rd->index[reader_slot(rd, row->id)] = rd->n_leases + 1;
        rd->leases[rd->n_leases++] = *row;
        return 0;
}

/* What came before a "reset" is what the brokerd that wrote it knew, written again after it: damage there
 * hid nothing from it (damage it had read would have made it record it: state-damage.h). */
static void reader_reset(Reader *rd) {
        rd->damaged = 0;
        rd->damage.size = 0;
        rests_free(rd->rests, rd->n_rests);
        rd->rests = NULL;
        rd->n_rests = 0;
        uses_free(rd->uses, rd->n_uses);
        rd->uses = NULL;
        rd->n_uses = rd->uses_allocated = 0;
        history_lease_rows_free(rd->leases, rd->n_leases);
        rd->leases = NULL;
        rd->n_leases = rd->allocated = 0;
        if (rd->index)
                memset(rd->index, 0, rd->index_size * sizeof(size_t));
}

static char *json_strdup(const json_t *v) {
        return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

#define LEASE_LOG_ALSO_MAX 64

/* Slots (and members, one per slot or absent) of a lease record, as checked. */
static int slots_from_json(const json_t *slots, const json_t *members, unsigned **ret_slots, unsigned *ret_n,
                           char ***ret_members) {
        if (!json_is_array(slots) || json_array_size(slots) == 0 || json_array_size(slots) > UINT_MAX ||
            (members && (!json_is_array(members) || json_array_size(members) != json_array_size(slots))))
                return -EBADMSG;
        unsigned n = (unsigned) json_array_size(slots);
        *ret_n = n;
        *ret_slots = calloc(n, sizeof(unsigned));
        if (!*ret_slots)
                return -ENOMEM;
        for (unsigned i = 0; i < n; i++) {
                json_t *v = json_array_get(slots, i);
                if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT_MAX)
                        return -EBADMSG;
                (*ret_slots)[i] = (unsigned) json_integer_value(v);
        }
        if (members) {
                *ret_members = calloc(n, sizeof(char *));
                if (!*ret_members)
                        return -ENOMEM;
                for (unsigned i = 0; i < n; i++) {
                        json_t *v = json_array_get(members, i);
                        if (json_is_null(v))
                                continue;
                        if (!((*ret_members)[i] = json_strdup(v)))
                                return json_is_string(v) ? -ENOMEM : -EBADMSG;
                }
        }
        return 0;
}

/* "also": an all-or-nothing lease's further pools. Anything malformed is damage: the whole line is. */
/* Tokens above it are damage: far above any token issued (tokens continue above the realtime clock in µs,
 * ~2^51, one a grant), far below the wire's signed 64 bits, and token + 1 cannot wrap. */
#define LEASE_LOG_TOKEN_LIMIT (UINT64_C(1) << 62)

/* v is an integer in [lo, hi]: a line's numbers are checked before they are cast (untrusted as the line). */
static bool json_integer_in(const json_t *v, json_int_t lo, json_int_t hi) {
        return json_is_integer(v) && json_integer_value(v) >= lo && json_integer_value(v) <= hi;
}

static bool json_token_is_valid(const json_t *v) {
        return json_integer_in(v, 1, (json_int_t) LEASE_LOG_TOKEN_LIMIT);
}

static int row_also_from_json(const json_t *also, HistoryLeaseRow *row) {
        if (!json_is_array(also) || json_array_size(also) == 0 || json_array_size(also) > LEASE_LOG_ALSO_MAX)
                return -EBADMSG;
        size_t n = json_array_size(also);
        row->also = calloc(n, sizeof(HistoryLeaseAlso));
        if (!row->also)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                const json_t *a = json_array_get(also, i);
                HistoryLeaseAlso *h = row->also + row->n_also++;
                if (!json_is_object(a) || !json_is_string(json_object_get(a, "pool")) ||
                    !json_token_is_valid(json_object_get(a, "token")))
                        return -EBADMSG;
                if (!(h->pool = json_strdup(json_object_get(a, "pool"))))
                        return -ENOMEM;
                h->token = (uint64_t) json_integer_value(json_object_get(a, "token"));
                const json_t *v = json_object_get(a, "remote");
                if (v && !(h->remote_id = json_strdup(v)))
                        return json_is_string(v) ? -ENOMEM : -EBADMSG;
                int r = slots_from_json(json_object_get(a, "slots"), json_object_get(a, "members"), &h->slots,
                                        &h->n_slots, &h->members);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* "quarantine":{"exitCodes":[3,4],"after":1}: statuses 1–255, at least one. */
static int row_quarantine_from_json(const json_t *q, HistoryLeaseRow *row) {
        const json_t *codes = json_object_get(q, "exitCodes");
        if (!json_is_object(q) || !json_is_array(codes) || json_array_size(codes) == 0 ||
            !json_integer_in(json_object_get(q, "after"), 1, CONF_QUARANTINE_AFTER_MAX))
                return -EBADMSG;
        for (size_t i = 0; i < json_array_size(codes); i++) {
                const json_t *v = json_array_get(codes, i);
                if (!json_integer_in(v, 1, 255))
                        return -EBADMSG;
                json_int_t s = json_integer_value(v);
                row->quarantine_exit_codes[s / 64] |= UINT64_C(1) << (s % 64);
        }
        row->quarantine_after = (unsigned) json_integer_value(json_object_get(q, "after"));
        return 0;
}

static int row_from_json(const json_t *o, HistoryLeaseRow *ret) {
        _cleanup_(history_lease_row_done) HistoryLeaseRow row = { .expires_at = USEC_INFINITY };
        json_t *slots = json_object_get(o, "slots"), *members = json_object_get(o, "members"), *v;

        if (!json_is_string(json_object_get(o, "id")) || !json_is_string(json_object_get(o, "pool")) ||
            !json_is_string(json_object_get(o, "lane")) || !json_is_array(slots) ||
            !json_token_is_valid(json_object_get(o, "token")) ||
            !json_integer_in(json_object_get(o, "grantedAt"), 0, INT64_MAX) ||
            !json_integer_in(json_object_get(o, "uid"), 0, UINT32_MAX - 1) ||
            !json_integer_in(json_object_get(o, "pid"), 0, INT32_MAX) ||
            ((v = json_object_get(o, "commandPid")) && !json_integer_in(v, 0, INT32_MAX)) ||
            ((v = json_object_get(o, "commandStart")) && !json_integer_in(v, 0, INT64_MAX)) ||
            ((v = json_object_get(o, "expiresAt")) && !json_integer_in(v, 0, INT64_MAX)) ||
            (members && (!json_is_array(members) || json_array_size(members) != json_array_size(slots))) ||
            json_array_size(slots) > UINT_MAX)
                return -EBADMSG;
        row.id = json_strdup(json_object_get(o, "id"));
        row.pool = json_strdup(json_object_get(o, "pool"));
        row.lane = json_strdup(json_object_get(o, "lane"));
        if (!row.id || !row.pool || !row.lane)
                return -ENOMEM;
        row.n_slots = (unsigned) json_array_size(slots);
        row.slots = calloc(MAX(row.n_slots, 1u), sizeof(unsigned));
        if (!row.slots)
                return -ENOMEM;
        for (unsigned i = 0; i < row.n_slots; i++) {
                v = json_array_get(slots, i);
                if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT_MAX)
                        return -EBADMSG;
                row.slots[i] = (unsigned) json_integer_value(v);
        }
        if (members) {
                row.members = calloc(MAX(row.n_slots, 1u), sizeof(char *));
                if (!row.members)
                        return -ENOMEM;
                for (unsigned i = 0; i < row.n_slots; i++) {
                        v = json_array_get(members, i);
                        if (json_is_null(v))
                                continue;
                        if (!(row.members[i] = json_strdup(v)))
                                return json_is_string(v) ? -ENOMEM : -EBADMSG;
                }
        }
        row.token = (uint64_t) json_integer_value(json_object_get(o, "token"));
        if ((v = json_object_get(o, "job")) && !(row.job = json_strdup(v)))
                return -EBADMSG;
        row.uid = (uid_t) json_integer_value(json_object_get(o, "uid"));
        row.pid = (pid_t) json_integer_value(json_object_get(o, "pid"));
        row.command_pid = (pid_t) json_integer_value(json_object_get(o, "commandPid"));
        row.command_start_time = (uint64_t) json_integer_value(json_object_get(o, "commandStart"));
        row.detached = json_is_true(json_object_get(o, "detached"));
        /* A health job's lease says so ("health":true); its absence, an ordinary lease's, or a line from a
         * brokerd before it: read as ordinary, which is what a restart did before (a health = yes lane's lease
         * is a health job's whatever the line says: pool-local.c's restore). */
        row.health_known = true;
        row.health = json_is_true(json_object_get(o, "health"));
        row.granted_at = (usec_t) json_integer_value(json_object_get(o, "grantedAt"));
        if ((v = json_object_get(o, "expiresAt")))
                row.expires_at = (usec_t) json_integer_value(v);
        if ((v = json_object_get(o, "remote")) && !(row.remote_id = json_strdup(v)))
                return json_is_string(v) ? -ENOMEM : -EBADMSG;
        if ((v = json_object_get(o, "also"))) {
                int r = row_also_from_json(v, &row);
                if (r < 0)
                        return r;
        }
        if ((v = json_object_get(o, "quarantine")) && row_quarantine_from_json(v, &row) < 0)
                return -EBADMSG;
        json_t *k = json_object_get(o, "backend");
        if (k) {
                HistoryLeaseBackend *bk = &row.backend;
                const struct { const char *name; char **to; bool required; } fields[] = {
                        { "url", &bk->url, true },
                        { "user", &bk->user, false },
                        { "passwordFile", &bk->password_file, false },
                        { "sentinelPasswordFile", &bk->sentinel_password_file, false },
                };
                if (!json_is_object(k))
                        return -EBADMSG;
                for (size_t i = 0; i < ELEMENTSOF(fields); i++) {
                        v = json_object_get(k, fields[i].name);
                        if (!v && !fields[i].required)
                                continue;
                        if (!v || !(*fields[i].to = json_strdup(v)))
                                return v && json_is_string(v) ? -ENOMEM : -EBADMSG;
                }
                v = json_object_get(k, "nodeTtl");
                if (!json_is_integer(v) || json_integer_value(v) <= 0)
                        return -EBADMSG;
                bk->node_ttl = (usec_t) json_integer_value(v);
        }
        *ret = row;
        row = (HistoryLeaseRow) {};
        return 0;
}

/* One record. Returns 0, -EBADMSG (it does not say what a record says), -ENOMEM. */
static int reader_apply(Reader *rd, const json_t *o) {
        json_t *v;
        int r;

        if ((v = json_object_get(o, "lease"))) {
                HistoryLeaseRow row;
                r = row_from_json(v, &row);
                if (r < 0)
                        return r;
                /* brokerd ran when it granted it: alive marks are written only while a lease is held, so
                 * the newest grant can be the last proof of life. */
                rd->alive_at = MAX(rd->alive_at, row.granted_at);
                return reader_add(rd, &row);
        } else if ((v = json_object_get(o, "end"))) {
                if (!json_is_string(v))
                        return -EBADMSG;
                reader_forget(rd, json_string_value(v));
        } else if ((v = json_object_get(o, "token"))) {
                json_t *pool = json_object_get(v, "pool"), *next = json_object_get(v, "next");
                if (!json_is_string(pool) || !json_integer_in(next, 0, (json_int_t) LEASE_LOG_TOKEN_LIMIT))
                        return -EBADMSG;
                return marks_raise(&rd->marks, &rd->n_marks, json_string_value(pool), (uint64_t) json_integer_value(next));
        } else if ((v = json_object_get(o, "alive"))) {
                /* A time, as grantedAt: a negative one read as unsigned would be a mark from the far future. */
                if (!json_integer_in(v, 0, INT64_MAX))
                        return -EBADMSG;
                rd->alive_at = MAX(rd->alive_at, (usec_t) json_integer_value(v));
        } else if ((v = json_object_get(o, "rest"))) {
                /* Untrusted as any line: a name the config could have, a slot below CONF_LIMIT_MAX, a time. */
                json_t *pool = json_object_get(v, "pool"), *slot = json_object_get(v, "slot"),
                       *member = json_object_get(v, "member"), *until = json_object_get(v, "until");
                if (!json_is_string(pool) || !conf_name_is_valid(json_string_value(pool)) || !json_is_integer(slot) ||
                    json_integer_value(slot) < 0 || json_integer_value(slot) >= CONF_LIMIT_MAX ||
                    (member && (!json_is_string(member) || !conf_name_is_valid(json_string_value(member)))) ||
                    !json_is_integer(until) || json_integer_value(until) <= 0 || json_object_size(v) != 3u + !!member)
                        return -EBADMSG;
                return rests_set(&rd->rests, &rd->n_rests, json_string_value(pool),
                                 (unsigned) json_integer_value(slot), member ? json_string_value(member) : NULL,
                                 (usec_t) json_integer_value(until));
        } else if ((v = json_object_get(o, "use"))) {
                /* Untrusted as any line: names the config could have, counts that are numbers. */
                json_t *pool = json_object_get(v, "pool"), *member = json_object_get(v, "member");
                static const char *const counts[] = { "grants", "heldUs", "quarantines", "failures" };
                uint64_t n[ELEMENTSOF(counts)];
                if (!json_is_string(pool) || !conf_name_is_valid(json_string_value(pool)) || !json_is_string(member) ||
                    !conf_name_is_valid(json_string_value(member)) || json_object_size(v) != 2 + ELEMENTSOF(counts))
                        return -EBADMSG;
                for (size_t i = 0; i < ELEMENTSOF(counts); i++) {
                        json_t *c = json_object_get(v, counts[i]);
                        if (!json_is_integer(c) || json_integer_value(c) < 0 ||
                            (i == 1 && (usec_t) json_integer_value(c) >= USEC_INFINITY / 2) ||
                            (i == 3 && json_integer_value(c) > UINT_MAX))
                                return -EBADMSG;
                        n[i] = (uint64_t) json_integer_value(c);
                }
                return uses_append(&rd->uses, &rd->n_uses, &rd->uses_allocated,
                                &(LeaseLogUse) { .pool = (char *) json_string_value(pool),
                                                 .member = (char *) json_string_value(member), .grants = n[0],
                                                 .held = n[1], .quarantines = n[2], .failures = (unsigned) n[3] });
        } else if (json_is_true(json_object_get(o, "reset"))) {
                reader_reset(rd);
        } else
                return -EBADMSG;
        return 0;
}

/* A line's JSON, if its CRC checks out. */
static json_t *line_parse(const char *line, size_t size) {
        char hex[9];
        if (size < 10 || line[8] != ' ')
                return NULL;
        memcpy(hex, line, 8);
        hex[8] = 0;
        char *end;
        unsigned long crc = strtoul(hex, &end, 16);
        if (*end || crc != crc32_of(line + 9, size - 9))
                return NULL;
        return json_loadb(line + 9, size - 9, JSON_REJECT_DUPLICATES, NULL);
}

static int read_all(int fd, char **ret, size_t *ret_size) {
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        if ((uint64_t) st.st_size > LEASE_LOG_MAX_SIZE)
                return -EFBIG;
        size_t size = (size_t) st.st_size, got = 0;
        _cleanup_free_ char *data = malloc(size + 1);
        if (!data)
                return -ENOMEM;
        while (got < size) {
                ssize_t k = read(fd, data + got, size - got);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return -errno;
                if (k == 0)
                        break;
                got += (size_t) k;
        }
        *ret_size = got;
        *ret = TAKE_PTR(data);
        return 0;
}

static char *path_in(const char *directory, const char *name) {
        char *p;
        return asprintf(&p, "%s/%s", directory, name) < 0 ? NULL : p;
}

int lease_log_read(const char *directory, HistoryState *ret_state, LeaseLogRead *ret_info) {
        _cleanup_free_ char *path = path_in(directory, LEASE_LOG_FILE), *data = NULL;
        _cleanup_close_ int fd = -EBADF;
        _cleanup_(reader_done) Reader rd = {};
        LeaseLogRead info = {};
        size_t size = 0;
        int r;

        if (!path)
                return -ENOMEM;
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0 && errno != ENOENT)
                return -errno;
        if (fd >= 0) {
                info.exists = true;
                r = read_all(fd, &data, &size);
                if (r < 0)
                        return r;
                bool header = false;
                for (size_t at = 0; at < size;) {
                        char *nl = memchr(data + at, '\n', size - at);
                        if (!nl)
                                break; /* a torn last line: its write never completed, nothing waited for it */
                        size_t len = (size_t) (nl - (data + at));
                        json_t *o = line_parse(data + at, len);
                        if (!header) {
                                bool ok = o && len == 9 + strlen(LEASE_LOG_HEADER) &&
                                          memcmp(data + at + 9, LEASE_LOG_HEADER, len - 9) == 0;
                                json_decref(o);
                                if (!ok)
                                        return -EBADMSG;
                                header = true;
                        } else {
                                r = o ? reader_apply(&rd, o) : -EBADMSG;
                                json_decref(o);
                                if (r == -ENOMEM)
                                        return r;
                                if (r < 0) {
                                        rd.damaged++;
                                        if (rd.damage.size + len + 1 <= LEASE_LOG_DAMAGE_KEEP &&
                                            buffer_put(&rd.damage, data + at, len + 1) < 0)
                                                return -ENOMEM;
                                }
                        }
                        at += len + 1;
                }
                if (!header && size > 0)
                        return -EBADMSG;
        }

        HistoryState s = { .alive_at = rd.alive_at };
        s.floors = calloc(MAX(rd.n_marks, (size_t) 1), sizeof(HistoryTokenFloor));
        if (!s.floors)
                return -ENOMEM;
        for (size_t i = 0; i < rd.n_marks; i++)
                s.floors[s.n_floors++] = (HistoryTokenFloor) { .pool = TAKE_PTR(rd.marks[i].pool),
                                                               .next_token = rd.marks[i].next };
        s.leases = TAKE_PTR(rd.leases);
        s.n_leases = rd.n_leases;
        rd.n_leases = 0;
        *ret_state = s;
        info.damaged = rd.damaged;
        info.damage = TAKE_PTR(rd.damage.data);
        info.damage_size = rd.damage.size;
        info.rests = TAKE_PTR(rd.rests);
        info.n_rests = rd.n_rests;
        rd.n_rests = 0;
        if (uses_dedupe(rd.uses, &rd.n_uses) < 0)
                return -ENOMEM;
        info.uses = TAKE_PTR(rd.uses);
        info.n_uses = rd.n_uses;
        rd.n_uses = 0;
        if (ret_info)
                *ret_info = info;
        else
                lease_log_read_done(&info);
        return 0;
}

int lease_log_move_aside(const char *directory, char **ret_moved) {
        _cleanup_free_ char *path = path_in(directory, LEASE_LOG_FILE);
        if (!path)
                return -ENOMEM;
        return rename_aside(path, /* missing_ok= */ false, ret_moved);
}

/* ---- writing ---- */

static void lease_log_reserve(LeaseLog *log) {
        if (log->reserved_to - log->size >= LEASE_LOG_RESERVE / 2)
                return;
        if (fallocate(log->fd, FALLOC_FL_KEEP_SIZE, log->size, LEASE_LOG_RESERVE) == 0)
                log->reserved_to = log->size + LEASE_LOG_RESERVE;
        /* else: no room, or a file system without it; the next write will tell */
}

/* Cuts off what a failed write left of its lines. Should that fail too, a reader skips the half line as
 * damaged, and moves every token mark above the clock: safe, and loud. */
static void truncate_back(LeaseLog *log) {
        if (ftruncate(log->fd, log->size) < 0)
                return;
}

/* A snapshot: the token marks, the live leases, the alive mark; lines counted into *lines. */
static int snapshot_format(const LeaseLog *log, Buffer *b, const HistoryLeaseRow *leases, size_t n, usec_t alive,
                           size_t *lines) {
        int r = 0;
        for (size_t i = 0; r == 0 && i < log->n_marks; i++)
                r = line_token(b, &log->marks[i]);
        for (size_t i = 0; r == 0 && i < n; i++)
                r = line_lease(b, &leases[i]);
        for (size_t i = 0; r == 0 && i < log->n_rests; i++)
                if (log->rests[i].until > alive) {
                        r = line_rest(b, &log->rests[i]);
                        (*lines)++;
                }
        for (size_t i = 0; r == 0 && i < log->n_uses; i++)
                r = line_use(b, &log->uses[i]);
        if (r == 0 && alive > 0)
                r = line_alive(b, alive);
        *lines += log->n_marks + n + log->n_uses + (alive > 0);
        return r;
}

/* Into a fresh file renamed over the log: the way a log shrinks. */
static int rewrite_by_rename(LeaseLog *log, const HistoryLeaseRow *leases, size_t n, usec_t alive) {
        _cleanup_free_ char *tmp = path_in(log->directory, LEASE_LOG_FILE ".new");
        Buffer b = {};
        size_t lines = 1;
        int r;

        if (!tmp)
                return -ENOMEM;
        r = line_literal(&b, LEASE_LOG_HEADER);
        r = r ?: snapshot_format(log, &b, leases, n, alive, &lines);
        if (r < 0) {
                free(b.data);
                return r;
        }
        _cleanup_close_ int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOCTTY, 0600);
        if (fd < 0) {
                free(b.data);
                return -errno;
        }
        r = fd_write_all(fd, b.data, b.size);
        free(b.data);
        if (r == 0 && rename(tmp, log->path) < 0)
                r = -errno;
        if (r < 0) {
                (void) unlink(tmp);
                return r;
        }
        safe_close(log->fd);
        log->fd = TAKE_FD(fd);
        log->size = (off_t) b.size;
        log->reserved_to = 0;
        log->lines = lines;
        lease_log_reserve(log);
        return 0;
}

/* Appended after a "reset" line to the log as it is: for a directory that takes no new file. */
static int rewrite_in_place(LeaseLog *log, const HistoryLeaseRow *leases, size_t n, usec_t alive) {
        Buffer b = {};
        size_t lines = 0;
        int r;

        if (log->fd < 0) {
                log->fd = open(log->path, O_RDWR | O_APPEND | O_CLOEXEC | O_NOCTTY);
                if (log->fd < 0)
                        return -errno;
                log->reserved_to = 0;
        }
        struct stat st;
        if (fstat(log->fd, &st) < 0)
                return -errno;
        log->size = st.st_size;
        /* A write that failed and could not be cut off (truncate_back()) left half a line: ended here, so
         * that it is damage before the "reset" line, which then reads, and not glued to it. */
        char last = '\n';
        if (log->size > 0 && pread(log->fd, &last, 1, log->size - 1) != 1)
                last = 0;
        if (log->size == 0) {
                r = line_literal(&b, LEASE_LOG_HEADER);
                lines++;
        } else
                r = last == '\n' ? 0 : buffer_put(&b, "\n", 1);
        r = r ?: line_literal(&b, "{\"reset\":true}");
        lines++;
        r = r ?: snapshot_format(log, &b, leases, n, alive, &lines);
        if (r == 0)
                r = fd_write_all(log->fd, b.data, b.size);
        if (r < 0)
                truncate_back(log);
        else {
                log->size += (off_t) b.size;
                log->lines += lines;
                lease_log_reserve(log);
        }
        free(b.data);
        return r;
}

int lease_log_rewrite(LeaseLog *log, const HistoryLeaseRow *leases, size_t n, usec_t alive) {
        /* Rests that ended are no longer worth a line. */
        if (alive > 0) {
                size_t j = 0;
                for (size_t i = 0; i < log->n_rests; i++)
                        if (log->rests[i].until > alive)
                                log->rests[j++] = log->rests[i];
                        else {
                                free(log->rests[i].pool);
                                free(log->rests[i].member);
                        }
                log->n_rests = j;
        }
        int r = rewrite_by_rename(log, leases, n, alive);
        if (r < 0 && r != -ENOMEM)
                r = rewrite_in_place(log, leases, n, alive);
        if (r == 0) {
                log->broken = false;
                log->pending.size = 0;
                log->pending_lines = 0;
        }
        return r;
}

int lease_log_new(const char *directory, const HistoryState *marks, uint64_t floor_all, LeaseLog **ret) {
        _cleanup_(lease_log_freep) LeaseLog *log = calloc(1, sizeof(LeaseLog));

        if (!log)
                return -ENOMEM;
        log->fd = -EBADF;
        log->broken = true; /* until a snapshot is written */
        log->directory = strdup(directory);
        log->path = path_in(directory, LEASE_LOG_FILE);
        if (!log->directory || !log->path)
                return -ENOMEM;
        for (size_t i = 0; i < marks->n_floors; i++)
                if (marks_raise(&log->marks, &log->n_marks, marks->floors[i].pool, marks->floors[i].next_token) < 0)
                        return -ENOMEM;
        for (size_t i = 0; i < marks->n_leases; i++)
                if (marks_raise(&log->marks, &log->n_marks, marks->leases[i].pool, marks->leases[i].token + 1) < 0)
                        return -ENOMEM;
        if (floor_all > 0 && marks_raise(&log->marks, &log->n_marks, HISTORY_TOKEN_FLOOR_ALL, floor_all) < 0)
                return -ENOMEM;
        *ret = TAKE_PTR(log);
        return 0;
}

LeaseLog *lease_log_free(LeaseLog *log) {
        if (!log)
                return NULL;
        safe_close(log->fd);
        free(log->pending.data);
        marks_free(log->marks, log->n_marks);
        rests_free(log->rests, log->n_rests);
        uses_free(log->uses, log->n_uses);
        free(log->directory);
        free(log->path);
        free(log);
        return NULL;
}

int lease_log_add(LeaseLog *log, const HistoryLeaseRow *row) {
        int r = marks_raise(&log->marks, &log->n_marks, row->pool, row->token + 1);
        for (size_t i = 0; r == 0 && i < row->n_also; i++)
                r = marks_raise(&log->marks, &log->n_marks, row->also[i].pool, row->also[i].token + 1);
        r = r ?: line_lease(&log->pending, row);
        log->pending_lines += r == 0;
        return r;
}

int lease_log_end(LeaseLog *log, const char *id) {
        int r = line_end_of(&log->pending, id);
        log->pending_lines += r == 0;
        return r;
}

int lease_log_alive(LeaseLog *log, usec_t realtime) {
        int r = line_alive(&log->pending, realtime);
        log->pending_lines += r == 0;
        return r;
}

int lease_log_rest(LeaseLog *log, const char *pool, unsigned slot, const char *member, usec_t until) {
        LeaseLogRest rs = { .pool = (char *) pool, .slot = slot, .member = (char *) member, .until = until };
        int r = rests_set(&log->rests, &log->n_rests, pool, slot, member, until);
        r = r ?: line_rest(&log->pending, &rs);
        log->pending_lines += r == 0;
        return r;
}

int lease_log_use(LeaseLog *log, const LeaseLogUse *u) {
        int r = uses_set(&log->uses, &log->n_uses, u);
        r = r ?: line_use(&log->pending, u);
        log->pending_lines += r == 0;
        return r;
}

int lease_log_adopt_uses(LeaseLog *log, LeaseLogUse *uses, size_t n) {
        for (size_t i = 0; log->n_uses > 0 && i < n; i++) {
                int r = uses_set(&log->uses, &log->n_uses, &uses[i]);
                if (r < 0) {
                        uses_free(uses, n);
                        return r;
                }
        }
        if (log->n_uses > 0) {
                uses_free(uses, n);
                return 0;
        }
        free(log->uses);
        log->uses = uses;
        log->n_uses = n;
        return 0;
}

const LeaseLogUse *lease_log_uses(const LeaseLog *log, size_t *ret_n) {
        *ret_n = log->n_uses;
        return log->uses;
}

int lease_log_rests_end(LeaseLog *log, LeaseLogRestFn still_resting, void *userdata, usec_t now) {
        for (size_t i = 0; i < log->n_rests; i++) {
                LeaseLogRest *rs = &log->rests[i];
                if (rs->until <= now || still_resting(rs->pool, rs->slot, rs->member, userdata))
                        continue;
                rs->until = now;
                int r = line_rest(&log->pending, rs);
                if (r < 0)
                        return r;
                log->pending_lines++;
        }
        return 0;
}

bool lease_log_has_pending(const LeaseLog *log) {
        return log->pending.size > 0;
}

int lease_log_flush(LeaseLog *log) {
        int r = 0;

        if (log->pending.size == 0)
                return log->broken ? -EIO : 0;
        if (log->broken)
                r = -EIO; /* lines may be missing before these: only a rewrite mends it */
        else {
                r = fd_write_all(log->fd, log->pending.data, log->pending.size);
                if (r < 0) {
                        truncate_back(log); /* no half line in the middle of the log */
                        log->broken = true;
                } else {
                        log->size += (off_t) log->pending.size;
                        log->lines += log->pending_lines;
                        lease_log_reserve(log);
                }
        }
        log->pending.size = 0;
        log->pending_lines = 0;
        return r;
}

bool lease_log_is_broken(const LeaseLog *log) {
        return log->broken;
}

bool lease_log_wants_rewrite(const LeaseLog *log, size_t n_live) {
        /* The members' counts are kept whole in every snapshot: they are no growth. */
        return log->lines > LEASE_LOG_REWRITE_SLACK + 4 * n_live + log->n_uses;
}

uint64_t lease_log_token_mark(const LeaseLog *log, const char *pool) {
        const TokenMark *m = marks_find(log->marks, log->n_marks, pool);
        return m ? m->next : 0;
}
