/* SPDX-License-Identifier: MIT */
/* shared-scripts.h — the Lua scripts of shared pools, as Redis runs them: brokerd/lua/prelude.lua followed
 * by one operation's file, embedded byte for byte at build time (tools/embed-text.py). Their arguments and
 * replies are in brokerd/lua/README. */
#pragma once

#include <stddef.h>

typedef struct SharedScriptText {
        const char *name;       /* "submit", …: the operation file's name */
        const char *text;       /* NUL-terminated */
} SharedScriptText;

extern const char shared_script_submit[];
extern const char shared_script_release[];
extern const char shared_script_withdraw[];
extern const char shared_script_tick[];
extern const char shared_script_reclaim[];
extern const char shared_script_drain[];
extern const char shared_script_positions[];

/* Every script, in a fixed order; n is the count. */
extern const SharedScriptText shared_scripts[];
extern const size_t shared_scripts_n;
