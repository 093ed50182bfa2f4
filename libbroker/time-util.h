/* SPDX-License-Identifier: MIT */
/* time-util.h — microsecond time values and systemd's time-span syntax ("500ms", "1h 30min", "infinity"). */
#pragma once

#include <stddef.h>
#include <stdint.h>

typedef uint64_t usec_t;

#define USEC_INFINITY ((usec_t) UINT64_MAX)
#define NSEC_PER_USEC ((uint64_t) 1000)
#define USEC_PER_MSEC ((usec_t) 1000)
#define USEC_PER_SEC ((usec_t) 1000000)
#define USEC_PER_MINUTE (60 * USEC_PER_SEC)
#define USEC_PER_HOUR (60 * USEC_PER_MINUTE)
#define USEC_PER_DAY (24 * USEC_PER_HOUR)
#define USEC_PER_WEEK (7 * USEC_PER_DAY)

/* Parses a time span; a bare number counts in default_unit (USEC_PER_SEC for config files).
 * Returns 0, -EINVAL on syntax errors, -ERANGE on overflow; *ret_usec untouched on failure. */
int timespan_parse(const char *s, usec_t default_unit, usec_t *ret_usec);

/* Formats like systemd ("1min 30s", "250ms", "infinity"), exact: no unit is rounded away. Returns buf. */
const char *timespan_format(char *buf, size_t size, usec_t t);
#define TIMESPAN_MAX 64

usec_t now_monotonic(void);
usec_t now_realtime(void);
/* Monotonic and running while the machine is suspended: for deadlines set by another host's clock. */
usec_t now_boottime(void);

static inline usec_t usec_add(usec_t a, usec_t b) {
        return a > USEC_INFINITY - b ? USEC_INFINITY : a + b;
}

static inline usec_t usec_sub_unsigned(usec_t a, usec_t b) {
        return a > b ? a - b : 0;
}

/* The realtime instant a monotonic one stands for, both clocks read at one moment (now_mono, now_real); one
 * in the past too, as it was (never clamped to now). */
static inline usec_t usec_mono_to_real(usec_t mono, usec_t now_mono, usec_t now_real) {
        return mono >= now_mono ? usec_add(now_real, mono - now_mono) : usec_sub_unsigned(now_real, now_mono - mono);
}
