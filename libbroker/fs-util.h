/* SPDX-License-Identifier: MIT */
/* fs-util.h — file-system helpers the daemon's modules share. */
#pragma once

#include <sys/types.h>

/* Creates the directories leading to path, not path itself ("/run/a/b/sock": /run, /run/a, /run/a/b),
 * each with mode where it is created; existing ones are left as they are. Returns 0 or negative errno. */
int mkdir_parents(const char *path, mode_t mode);
