/* SPDX-License-Identifier: MIT */
/* shared-rules.c — a shared pool's rules canon (shared-rules.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"
#include "shared-reply.h"
#include "shared-rules.h"
#include "strv.h"

static int canon_cmp(const void *a, const void *b) {
        const char *x = *(const char *const *) a, *y = *(const char *const *) b;
        /* Sorted by key: compare up to '=' ('=' sorts below every name character but '-' and '.'). */
        size_t lx = strcspn(x, "="), ly = strcspn(y, "=");
        int r = strncmp(x, y, MIN(lx, ly));
        return r != 0 ? r : (lx > ly) - (lx < ly);
}

/* Lane queue-timeouts are not in PoolLaneRule (only submit needs them, and carries them), so agreement does
 * not cover them. Labels and a lane's labels= are (SPEC §3.5: part of the pool's agreed rules), sorted:
 * label.NAME=MEMBER,… (a label that names no member is none: left out) and lane.L.labels=TERM,…. */
int shared_rules_canon(const PoolConfig *c, const PoolLaneRule *rules, size_t n_rules, usec_t ttl, char **ret) {
        size_t n = 0, cap = 12 + 6 * n_rules + c->n_labels;
        _cleanup_(strv_freep) char **lines = calloc(cap + 1, sizeof(char *));
        if (!lines)
                return -ENOMEM;
#define LINE(...) do { if (asprintf(&lines[n], __VA_ARGS__) < 0) { lines[n] = NULL; return -ENOMEM; } n++; } while (0)
        LINE("limit=%u", c->limit);
        if (c->members) {
                size_t len = 1;
                for (size_t i = 0; c->members[i]; i++)
                        len += strlen(c->members[i]) + 1;
                _cleanup_free_ char *joined = calloc(len, 1);
                if (!joined)
                        return -ENOMEM;
                for (size_t i = 0; c->members[i]; i++) {
                        if (i > 0)
                                strcat(joined, ",");
                        strcat(joined, c->members[i]);
                }
                LINE("members=%s", joined);
        }
        if (c->queue_timeout_set)
                LINE("queue-timeout=%" PRId64, shared_wire_usec(c->queue_timeout));
        if (c->congestion_timeout_set)
                LINE("queue-congestion-timeout=%" PRId64, shared_wire_usec(c->congestion_timeout));
        if (c->max_queue >= 0)
                LINE("max-queue=%" PRId64, c->max_queue);
        /* A rule only when set: a pool without it has the canon of before (brokerd/lua/README, "Rules canon"). */
        if (c->cooldown > 0)
                LINE("cooldown=%" PRIu64, c->cooldown);
        LINE("backend-node-ttl=%" PRIu64, ttl);
        /* SPEC §3.6: rules like the others, so that a brokerd whose scripts do not keep quarantines (before
         * them) never agrees to a pool that has them (brokerd/lua/README, "Members' lives"). */
        if (c->quarantine_exit_codes_set) {
                char codes[4 * 256] = "";
                size_t len = 0;
                for (int code = 1; code <= 255; code++)
                        if ((c->quarantine_exit_codes[code / 64] >> (code % 64)) & 1)
                                len += (size_t) snprintf(codes + len, sizeof codes - len, "%s%d", len > 0 ? "," : "", code);
                LINE("quarantine-exit-codes=%s", codes);
                LINE("quarantine-after=%u", MAX(c->quarantine_after, 1u));
        }
        for (size_t i = 0; i < n_rules; i++) {
                /* The lane of reservations is every pool's, in the scripts (prelude.lua, rules_from()): not a
                 * rule to agree on, so that the canon of a pool is what it was before reservations. */
                if (streq(rules[i].lane, ENGINE_RESERVE_LANE))
                        continue;
                LINE("lane.%s.priority=%d", rules[i].lane, rules[i].priority);
                LINE("lane.%s.max-in-use=%" PRId64, rules[i].lane, rules[i].max_in_use);
                LINE("lane.%s.reserve=%u", rules[i].lane, rules[i].reserve);
                if (rules[i].budget_set)
                        LINE("lane.%s.queue-timeout=%" PRId64, rules[i].lane, shared_wire_usec(rules[i].budget));
                if (rules[i].labels && rules[i].labels[0]) {
                        _cleanup_free_ char *joined = NULL;
                        if (strv_join_sorted(rules[i].labels, ",", &joined) < 0)
                                return -ENOMEM;
                        LINE("lane.%s.labels=%s", rules[i].lane, joined);
                }
                /* SPEC §3.6: present only on a health lane (a pool without one has the canon of before); "also":
                 * quarantined members first, else ordinary ones (prelude.lua, HEALTH.first()). */
                if (rules[i].health)
                        LINE("lane.%s.health=%s", rules[i].lane, rules[i].health_also ? "also" : "1");
        }
        for (size_t i = 0; i < c->n_labels; i++) {
                if (!c->labels[i].members || !c->labels[i].members[0])
                        continue;
                _cleanup_free_ char *joined = NULL;
                if (strv_join_sorted(c->labels[i].members, ",", &joined) < 0)
                        return -ENOMEM;
                LINE("label.%s=%s", c->labels[i].name, joined);
        }
#undef LINE
        qsort(lines, n, sizeof(char *), canon_cmp);
        size_t len = 1;
        for (size_t i = 0; i < n; i++)
                len += strlen(lines[i]) + 1;
        char *s = calloc(len, 1);
        if (!s)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                strcat(s, lines[i]);
                strcat(s, "\n");
        }
        *ret = s;
        return 0;
}
