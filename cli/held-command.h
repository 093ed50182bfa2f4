/* SPDX-License-Identifier: MIT */
/* held-command.h — a command started held: its process exists (so the broker can verify its pid) before
 * it runs, and it runs only when told, with the environment it is given. */
#pragma once

#include <signal.h>
#include <sys/types.h>

#include "macro.h"

typedef struct HeldCommand HeldCommand;

/* Starts argv[0] (looked up along $PATH when it runs) held, in a process group of its own and killed
 * should the caller die first. It gets exec_mask as its signal mask when it runs. */
int held_command_new(char *const *argv, const sigset_t *exec_mask, HeldCommand **ret);
pid_t held_command_get_pid(const HeldCommand *c);
/* Lets it run with envp and returns once it has: 0, or the negative errno of its failed exec (the
 * process then exits 127 when the command was not found, 126 otherwise). Blocks for the exec alone. */
int held_command_start(HeldCommand *c, char *const *envp);
/* Frees what held it; a command never started exits 0 without running. Accepts NULL; returns NULL.
 * Waits for the process to leave the memory it shares with the caller: at once unless it is stopped. */
HeldCommand *held_command_free(HeldCommand *c);
DEFINE_TRIVIAL_CLEANUP_FUNC(HeldCommand *, held_command_free);
