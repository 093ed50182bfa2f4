/* SPDX-License-Identifier: MIT */
/* shared-scripts.h — the Lua of shared pools, embedded byte for byte at build time: the Redis Functions
 * library brokerd loads (tools/embed-lua-library.py: brokerd/lua/prelude.lua defined once, each operation a
 * function), and each operation as an EVAL script (prelude.lua + eval.lua + the operation's file,
 * tools/embed-text.py; tests and benchmarks). Their arguments and replies are in brokerd/lua/README. */
#pragma once

#include <stddef.h>

typedef struct SharedScriptText {
        const char *name;       /* "submit", …: the operation file's name */
        const char *text;       /* its EVAL script, NUL-terminated */
        const char *function;   /* its function in shared_library: "sb_DIGEST_submit", … */
} SharedScriptText;

extern const char shared_script_submit[];
extern const char shared_script_release[];
extern const char shared_script_withdraw[];
extern const char shared_script_tick[];
extern const char shared_script_reclaim[];
extern const char shared_script_drain[];
extern const char shared_script_positions[];
extern const char shared_script_renew[];
extern const char shared_script_quarantine[];

/* The library ("#!lua name=slotbroker_DIGEST" …, NUL-terminated), its name, and its functions' names:
 * DIGEST is of the text, so another build's library has other names (brokerd/lua/README). */
extern const char shared_library[];
extern const char shared_library_name[];
extern const char shared_function_submit[];
extern const char shared_function_release[];
extern const char shared_function_withdraw[];
extern const char shared_function_tick[];
extern const char shared_function_reclaim[];
extern const char shared_function_drain[];
extern const char shared_function_positions[];
extern const char shared_function_renew[];
extern const char shared_function_quarantine[];
/* Several operations of one pool in one call (brokerd/lua/batch.lua): a function of the library only. */
extern const char shared_function_batch[];
/* An all-or-nothing set over several pools of one backend in one call (brokerd/lua/set.lua): library only. */
extern const char shared_function_set[];

/* Every operation, in a fixed order; n is the count. */
extern const SharedScriptText shared_scripts[];
extern const size_t shared_scripts_n;
