/* SPDX-License-Identifier: MIT */
/* log.h — the daemon's own diagnostics on stderr, with syslog priority prefixes that journald reads when
 * stderr is connected to it. Decisions (the audit trail) go through audit.h instead. */
#pragma once

#include <errno.h>
#include <syslog.h>

#include "macro.h"

extern int log_max_level;

void log_setup(void);
/* Logs, and returns -abs(error) so that `return log_error_errno(r, …)` propagates r; "%m" prints error. */
int log_internal(int level, int error, const char *format, ...) _printf_(3, 4);

#define log_full_errno(level, error, ...)                                              \
        ({                                                                             \
                int _l = (level), _e = (error);                                        \
                _l <= log_max_level ? log_internal(_l, _e, __VA_ARGS__) : -abs(_e);    \
        })
#define log_debug(...) log_full_errno(LOG_DEBUG, 0, __VA_ARGS__)
#define log_info(...) log_full_errno(LOG_INFO, 0, __VA_ARGS__)
#define log_notice(...) log_full_errno(LOG_NOTICE, 0, __VA_ARGS__)
#define log_warning(...) log_full_errno(LOG_WARNING, 0, __VA_ARGS__)
#define log_error(...) log_full_errno(LOG_ERR, 0, __VA_ARGS__)
#define log_debug_errno(error, ...) log_full_errno(LOG_DEBUG, error, __VA_ARGS__)
#define log_warning_errno(error, ...) log_full_errno(LOG_WARNING, error, __VA_ARGS__)
#define log_error_errno(error, ...) log_full_errno(LOG_ERR, error, __VA_ARGS__)
#define log_oom() log_error_errno(ENOMEM, "Out of memory.")
