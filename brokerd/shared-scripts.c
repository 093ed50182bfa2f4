/* SPDX-License-Identifier: MIT */
/* shared-scripts.c — the table of the embedded Lua operations (shared-scripts.h). */
#include "shared-scripts.h"

const SharedScriptText shared_scripts[] = {
        { "submit", shared_script_submit, shared_function_submit },
        { "release", shared_script_release, shared_function_release },
        { "withdraw", shared_script_withdraw, shared_function_withdraw },
        { "tick", shared_script_tick, shared_function_tick },
        { "reclaim", shared_script_reclaim, shared_function_reclaim },
        { "drain", shared_script_drain, shared_function_drain },
        { "positions", shared_script_positions, shared_function_positions },
        { "renew", shared_script_renew, shared_function_renew },
        { "quarantine", shared_script_quarantine, shared_function_quarantine },
};
const size_t shared_scripts_n = sizeof shared_scripts / sizeof shared_scripts[0];
