/* SPDX-License-Identifier: MIT */
#include <errno.h>

#include "history.h"
#include "lease.h"
#include "log.h"
#include "manager.h"
#include "persistence.h"

const char *persistence_refusal(Manager *m) {
        /* Reading comes first in either mode: a slot the database says is held must not be handed out. */
        if (!m->state_loaded)
                return "the state directory cannot be read";
        if (m->lease_persistence == LEASE_PERSISTENCE_BEST_EFFORT)
                return NULL;
        if (!m->history || !history_is_writable(m->history))
                return "leases cannot be written to the state directory";
        return NULL;
}

void persistence_note_refused(Manager *m, const char *why) {
        m->storage_refused++;
        if (m->storage_refusing)
                return;
        m->storage_refusing = true;
        log_error("Refusing new leases (unavailable): %s. Held leases stay; retrying.", why);
}

bool persistence_commit_allows_grant(Manager *m, Lease *l, int result) {
        if (result == 0) {
                persistence_recovered(m);
                return true;
        }
        if (m->lease_persistence != LEASE_PERSISTENCE_BEST_EFFORT)
                return false;
        m->storage_unpersisted_grants++;
        if (!m->storage_unpersisted) {
                m->storage_unpersisted = true;
                log_warning("Granting leases that are not persisted (lease-persistence=best-effort), %s first: a "
                            "restart meanwhile forgets them.",
                            l->id);
        }
        return true;
}

void persistence_recovered(Manager *m) {
        if (m->storage_refusing && m->state_loaded && (!m->history || history_is_writable(m->history))) {
                log_info("Leases are persisted again; %u request(s) were refused meanwhile.", m->storage_refused);
                m->storage_refusing = false;
                m->storage_refused = 0;
        }
        if (m->storage_unpersisted && m->history && history_is_writable(m->history)) {
                log_info("Leases are persisted again; %u lease(s) were granted without being written meanwhile.",
                         m->storage_unpersisted_grants);
                m->storage_unpersisted = false;
                m->storage_unpersisted_grants = 0;
        }
}
