/* SPDX-License-Identifier: MIT */
/* shared-scripts.c — the table of the embedded Lua scripts (shared-scripts.h). */
#include "shared-scripts.h"

const SharedScriptText shared_scripts[] = {
        { "submit", shared_script_submit },
        { "release", shared_script_release },
        { "withdraw", shared_script_withdraw },
        { "tick", shared_script_tick },
        { "reclaim", shared_script_reclaim },
        { "drain", shared_script_drain },
        { "positions", shared_script_positions },
};
const size_t shared_scripts_n = sizeof shared_scripts / sizeof shared_scripts[0];
