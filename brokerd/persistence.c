/* SPDX-License-Identifier: MIT */
#include <errno.h>

#include "lease-log.h"
#include "log.h"
#include "persistence.h"
#include "state-damage.h"

const char *persistence_refusal(const Persistence *p) {
        /* Reading comes first in either mode: a slot the database says is held must not be handed out. */
        if (!p->state_loaded)
                return "the state directory cannot be read";
        if (p->damaged)
                return "the state directory held what could not be read (" STATE_DAMAGE_FILE ")";
        if (p->mode == LEASE_PERSISTENCE_BEST_EFFORT)
                return NULL;
        if (!p->log || lease_log_is_broken(p->log))
                return "leases cannot be written to the state directory";
        return NULL;
}

void persistence_note_refused(Persistence *p, const char *why) {
        p->refused++;
        if (p->refusing)
                return;
        p->refusing = true;
        log_error("Refusing new leases (unavailable): %s. Held leases stay; retrying.", why);
}

bool persistence_commit_allows_grant(Persistence *p, const char *lease_id, int result) {
        if (result == 0) {
                persistence_recovered(p);
                return true;
        }
        if (p->mode != LEASE_PERSISTENCE_BEST_EFFORT)
                return false;
        p->unpersisted_grants++;
        if (!p->unpersisted) {
                p->unpersisted = true;
                log_warning("Granting leases that are not persisted (lease-persistence=best-effort), %s first: a "
                            "restart meanwhile forgets them.",
                            lease_id);
        }
        return true;
}

void persistence_recovered(Persistence *p) {
        if (p->refusing && p->state_loaded && !p->damaged && p->log && !lease_log_is_broken(p->log)) {
                log_info("Leases are persisted again; %u request(s) were refused meanwhile.", p->refused);
                p->refusing = false;
                p->refused = 0;
        }
        if (p->unpersisted && p->log && !lease_log_is_broken(p->log)) {
                log_info("Leases are persisted again; %u lease(s) were granted without being written meanwhile.",
                         p->unpersisted_grants);
                p->unpersisted = false;
                p->unpersisted_grants = 0;
        }
}
