/* SPDX-License-Identifier: MIT */
/* fuzz-lease-log.c — the state directory's lease log as a start reads it (lease_log_read()): whatever the
 * bytes, it is refused (not a lease log) or read, what is read is in range, and a snapshot of it, as brokerd
 * writes one at start, reads back to the same leases, token marks, rests and member counts, with nothing
 * damaged. Each input is read twice: as it is, and with every line's CRC made to match (a mutation seldom
 * keeps one, and the records behind it are the reader's harder part). */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc32-reference.h"
#include "lease-log.h"
#include "fuzz.h"

static const HistoryLeaseRow *lease_by_id(const HistoryState *s, const char *id) {
        for (size_t i = 0; i < s->n_leases; i++)
                if (strcmp(s->leases[i].id, id) == 0)
                        return &s->leases[i];
        return NULL;
}

static uint64_t mark_of(const HistoryState *s, const char *pool) {
        uint64_t m = 0;
        for (size_t i = 0; i < s->n_floors; i++)
                if (strcmp(s->floors[i].pool, pool) == 0 && s->floors[i].next_token > m)
                        m = s->floors[i].next_token;
        return m;
}

/* Every line "XXXXXXXX TEXT" gets the CRC-32 of its TEXT. */
static uint8_t *with_crcs(const uint8_t *data, size_t size) {
        uint8_t *out = malloc(size + 1);
        check(out);
        memcpy(out, data, size);
        for (size_t at = 0; at < size;) {
                uint8_t *nl = memchr(out + at, '\n', size - at);
                size_t len = nl ? (size_t) (nl - (out + at)) : size - at;
                if (len >= 9 && out[at + 8] == ' ') {
                        char hex[9];
                        snprintf(hex, sizeof hex, "%08" PRIx32, crc32_reference(out + at + 9, len - 9));
                        memcpy(out + at, hex, 8);
                }
                at += len + 1;
        }
        return out;
}

static void read_and_snapshot(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        read_and_snapshot(data, size);
        uint8_t *fixed = with_crcs(data, size);
        read_and_snapshot(fixed, size);
        free(fixed);
        return 0;
}

static void read_and_snapshot(const uint8_t *data, size_t size) {
        const FuzzDirs *dirs = fuzz_dirs(LEASE_LOG_FILE);
        const char *input_dir = dirs->input, *snapshot_dir = dirs->output;
        fuzz_write_file(input_dir, LEASE_LOG_FILE, data, size);

        HistoryState s = {}, back = {};
        LeaseLogRead info = {}, info_back = {};
        int r = lease_log_read(input_dir, &s, &info);
        if (r < 0) {
                check(r == -EBADMSG || r == -ENOMEM);
                return;
        }
        check(info.exists);
        check(info.damage_size <= LEASE_LOG_DAMAGE_KEEP && (info.damaged > 0 || info.damage_size == 0));
        for (size_t i = 0; i < s.n_leases; i++) {
                const HistoryLeaseRow *l = &s.leases[i];
                check(l->id && l->id[0] && l->pool && l->n_slots > 0);
                check(l->token >= 1 && l->token <= (UINT64_C(1) << 62));
                check(mark_of(&s, l->pool) > l->token);
        }

        /* Written again as the start writes it: the marks and leases read, the rests, the members' counts. */
        LeaseLog *log = NULL;
        check(lease_log_new(snapshot_dir, &s, 0, &log) == 0);
        size_t n_rests = 0, n_uses = info.n_uses;
        for (size_t i = 0; i < info.n_rests; i++) {
                const LeaseLogRest *rs = &info.rests[i];
                check(lease_log_rest(log, rs->pool, rs->slot, rs->member, rs->until) == 0);
                n_rests += s.alive_at == 0 || rs->until > s.alive_at;
        }
        check(lease_log_adopt_uses(log, info.uses, info.n_uses) == 0);
        info.uses = NULL;
        info.n_uses = 0;
        check(lease_log_rewrite(log, s.leases, s.n_leases, s.alive_at) == 0);
        lease_log_free(log);

        check(lease_log_read(snapshot_dir, &back, &info_back) == 0);
        check(info_back.damaged == 0);
        check(back.n_leases == s.n_leases);
        check(back.alive_at == s.alive_at);
        for (size_t i = 0; i < s.n_leases; i++) {
                const HistoryLeaseRow *a = &s.leases[i], *b = lease_by_id(&back, a->id);
                check(b && b->token == a->token && strcmp(b->pool, a->pool) == 0 && b->n_slots == a->n_slots &&
                      b->n_also == a->n_also && b->granted_at == a->granted_at && b->expires_at == a->expires_at);
                check(memcmp(b->slots, a->slots, a->n_slots * sizeof(unsigned)) == 0);
        }
        for (size_t i = 0; i < s.n_floors; i++)
                check(mark_of(&back, s.floors[i].pool) >= s.floors[i].next_token);
        check(info_back.n_rests == n_rests);
        check(info_back.n_uses == n_uses);

        history_state_done(&s);
        history_state_done(&back);
        lease_log_read_done(&info);
        lease_log_read_done(&info_back);
}
