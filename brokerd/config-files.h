/* SPDX-License-Identifier: MIT */
/* config-files.h — brokerd's configuration files: the main file, its drop-ins, the embedded default. */
#pragma once

/* Not "config.h": that name is meson's generated header (PACKAGE_VERSION), which a header in brokerd/
 * would shadow for every file here. */

#include <stddef.h>

#include "conf.h"

#define CONFIG_MAIN_PATH "/etc/brokerd/brokerd.conf"
#define CONFIG_FILE_SIZE_MAX ((size_t) 1024 * 1024)
#define CONFIG_LINE_MAX 65536

typedef enum ConfigLoadFlags {
        CONFIG_MAIN_REQUIRED = 1 << 0, /* a missing main file is an error (an explicit --config PATH) */
} ConfigLoadFlags;

/* Loads path (NULL: CONFIG_MAIN_PATH, which may be missing), then every *.conf of "<path>.d/" in
 * lexical order, later settings replacing earlier ones, and validates the result. With neither a main
 * file nor a drop-in: the embedded default, sized to the online CPUs. Returns 0, or -EINVAL with every
 * problem in errors (-ENOMEM likewise); *ret untouched on failure. */
int config_load(const char *path, BrokerConfig **ret, ConfErrors *errors);

/* config_load() with the paths spelled out: dropin_dir may be NULL (no drop-ins), n_cpus 0 asks sysconf(). */
int config_load_full(const char *main_path, const char *dropin_dir, ConfigLoadFlags flags, unsigned n_cpus,
                     BrokerConfig **ret, ConfErrors *errors);

/* Applies one file's text to c; name is used in "name:line" of errors. NUL bytes, oversize input and
 * lines longer than CONFIG_LINE_MAX are errors. No validation. Returns 0, -EINVAL, -EIO (a NUL byte or
 * oversize input: nothing of the text was applied, the error is recorded) or -ENOMEM. */
int config_parse_buffer(BrokerConfig *c, const char *data, size_t size, const char *name, ConfErrors *errors);

/* Parses text as the only configuration file (no drop-ins, no default) and validates it. For tests and
 * the fuzzer. Returns 0, -EINVAL or -ENOMEM; *ret untouched on failure. */
int config_load_string(const char *text, const char *name, BrokerConfig **ret, ConfErrors *errors);
int config_load_buffer(const char *data, size_t size, const char *name, BrokerConfig **ret, ConfErrors *errors);
