/* SPDX-License-Identifier: MIT */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "audit.h"
#include "lease.h"
#include "log.h"
#include "manager.h"

static bool is_routine(const char *decision) {
        return streq(decision, "granted") || streq(decision, "released");
}

void audit_decision(Manager *m, const AuditRecord *r) {
        char wait[TIMESPAN_MAX] = "-";
        if (r->wait != USEC_INFINITY)
                timespan_format(wait, sizeof wait, r->wait);
        int level = is_routine(r->decision) && m->config->audit != AUDIT_ALL ? LOG_DEBUG : LOG_INFO;
        log_full_errno(level, 0, "%s pool=%s lane=%s job=%s lease=%s uid=%d pid=%d wait=%s%s%s", r->decision,
                       r->pool ?: "-", r->lane ?: "-", r->job ?: "-", r->lease ?: "-", (int) r->uid, (int) r->pid,
                       wait, r->reason ? " reason=" : "", r->reason ?: "");
}

void audit_lease(const Lease *l, const char *decision, const char *reason) {
        AuditRecord r = AUDIT_RECORD_INIT;
        r.decision = decision;
        r.pool = engine_lease_pool(l->engine_lease);
        r.lane = engine_lease_lane(l->engine_lease);
        r.job = l->job;
        r.lease = l->id;
        r.token = engine_lease_token(l->engine_lease);
        r.hold = usec_sub_unsigned(now_monotonic(), l->granted_mono);
        r.uid = l->uid;
        r.pid = l->pid;
        r.reason = reason;
        audit_decision(l->manager, &r);
}

void audit_congestion(Manager *m, const char *pool, bool congested, usec_t idle) {
        char buf[TIMESPAN_MAX];
        log_info("pool %s %s (idle %s)", pool, congested ? "congested" : "no longer congested",
                 timespan_format(buf, sizeof buf, idle));
}
