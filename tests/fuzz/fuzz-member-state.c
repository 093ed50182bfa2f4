/* SPDX-License-Identifier: MIT */
/* fuzz-member-state.c — the state directory's members.state as a start reads it (member_state_read()):
 * whatever the bytes, it is refused whole or read, and what is read is written and reads back the same,
 * entry for entry. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"
#include "member-state.h"
#include "fuzz.h"

static bool entries_equal(const MemberStateEntry *a, const MemberStateEntry *b) {
        return streq(a->pool, b->pool) && streq_ptr(a->member, b->member) && a->drained == b->drained &&
               a->drain_since == b->drain_since && a->drain_until == b->drain_until &&
               streq_ptr(a->drain_by, b->drain_by) && streq_ptr(a->drain_reason, b->drain_reason) &&
               a->quarantined == b->quarantined && a->quarantine_since == b->quarantine_since &&
               streq_ptr(a->quarantine_job, b->quarantine_job) &&
               a->quarantine_exit_status == b->quarantine_exit_status &&
               streq_ptr(a->quarantine_reason, b->quarantine_reason);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        const FuzzDirs *dirs = fuzz_dirs(MEMBER_STATE_FILE);
        const char *input_dir = dirs->input, *written_dir = dirs->output;
        fuzz_write_file(input_dir, MEMBER_STATE_FILE, data, size);

        MemberStateEntry *e = NULL, *back = NULL;
        size_t n = 0, n_back = 0;
        int r = member_state_read(input_dir, &e, &n);
        if (r < 0) {
                check(r == -EBADMSG || r == -ENOMEM);
                return 0;
        }
        check(n <= MEMBER_STATE_ENTRIES_MAX);
        for (size_t i = 0; i < n; i++) {
                check(e[i].pool && (e[i].drained || e[i].quarantined));
                check(!e[i].quarantined || e[i].member); /* a quarantine is a member's */
                check(!e[i].drain_reason || member_state_text_is_valid(e[i].drain_reason));
                check(!e[i].quarantine_reason || member_state_text_is_valid(e[i].quarantine_reason));
        }
        check(member_state_write(written_dir, e, n) == 0);
        check(member_state_read(written_dir, &back, &n_back) == 0);
        check(n_back == n);
        for (size_t i = 0; i < n; i++)
                check(entries_equal(&e[i], &back[i]));
        member_state_entries_free(e, n);
        member_state_entries_free(back, n_back);
        return 0;
}
