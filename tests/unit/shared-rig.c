/* SPDX-License-Identifier: MIT */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "shared-rig.h"

/* How long the loop may take to hear every answer after one engine call: a stuck pool, not a slow one. */
#define SETTLE_TIMEOUT (60 * USEC_PER_SEC)

static uint64_t rig_random(void *userdata) {
        uint64_t *s = userdata;
        uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
        z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
        return z ^ (z >> 31);
}

/* Notices are for people; here they explain a failure (a refused pool, a rules mismatch). */
static void rig_notice(const char *pool, const SharedNotice *n, void *userdata) {
        fprintf(stderr, "# pool %s: notice %d %s\n", pool, n->type, n->detail ?: "");
}

void shared_rig_init(SharedRig *rig) {
        *rig = (SharedRig) { .random_state = 7 };
        assert_int_equal(sd_event_new(&rig->event), 0);
        snprintf(rig->node.id, sizeof rig->node.id, "%032x", 0xd1ffu);
        rig->node.name = (char *) "rig";
        backend_table_init(&rig->table, rig->event, &rig->node);
        rig->table.manual_clock = true;
        rig->table.random = rig_random;
        rig->table.on_notice = rig_notice;
        rig->table.userdata = &rig->random_state;
}

void shared_rig_done(SharedRig *rig) {
        if (!rig->event)
                return;
        backend_table_done(&rig->table);
        /* What the freed links left on the loop (closing sockets) runs now, not never. */
        (void) sd_event_run(rig->event, 0);
        rig->event = sd_event_unref(rig->event);
}

bool shared_rig_quiesce(SharedRig *rig) {
        usec_t deadline = usec_add(now_monotonic(), SETTLE_TIMEOUT);
        bool any = false;

        for (; !backend_table_is_settled(&rig->table); any = true) {
                if (now_monotonic() > deadline)
                        fail_msg("the shared pools did not settle within %" PRIu64 " s", SETTLE_TIMEOUT / USEC_PER_SEC);
                assert_true(sd_event_run(rig->event, 100 * USEC_PER_MSEC) >= 0);
        }
        return any;
}
