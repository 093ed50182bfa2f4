/* SPDX-License-Identifier: MIT */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "macro.h"
#include "time-util.h"

static const struct {
        const char *suffix;
        usec_t usec;
} units[] = {
        /* Longest first where one suffix is a prefix of another ("ms" before "m", "min" before "m"). */
        { "seconds", USEC_PER_SEC },  { "second", USEC_PER_SEC },  { "sec", USEC_PER_SEC },
        { "s", USEC_PER_SEC },        { "minutes", USEC_PER_MINUTE }, { "minute", USEC_PER_MINUTE },
        { "min", USEC_PER_MINUTE },   { "months", 2629800 * USEC_PER_SEC }, { "month", 2629800 * USEC_PER_SEC },
        { "msec", USEC_PER_MSEC },    { "ms", USEC_PER_MSEC },     { "M", 2629800 * USEC_PER_SEC },
        { "m", USEC_PER_MINUTE },     { "hours", USEC_PER_HOUR },  { "hour", USEC_PER_HOUR },
        { "hr", USEC_PER_HOUR },      { "h", USEC_PER_HOUR },      { "days", USEC_PER_DAY },
        { "day", USEC_PER_DAY },      { "d", USEC_PER_DAY },       { "weeks", USEC_PER_WEEK },
        { "week", USEC_PER_WEEK },    { "w", USEC_PER_WEEK },      { "years", 31557600 * USEC_PER_SEC },
        { "year", 31557600 * USEC_PER_SEC }, { "y", 31557600 * USEC_PER_SEC }, { "usec", 1 },
        { "us", 1 },                  { "µs", 1 },
};

static const char *skip_space(const char *p) {
        while (isspace((unsigned char) *p))
                p++;
        return p;
}

/* One "<number>[.<fraction>]<unit>" component; returns the position after it, or NULL with *ret_error
 * set to -EINVAL (syntax) or -ERANGE (overflow). */
static const char *parse_component(const char *p, usec_t default_unit, usec_t *ret, int *ret_error) {
        uint64_t whole = 0;
        const char *start = p;

        *ret_error = -EINVAL;
        if (!isdigit((unsigned char) *p) && *p != '.')
                return NULL;
        for (; isdigit((unsigned char) *p); p++) {
                if (whole > (UINT64_MAX - 9) / 10) {
                        *ret_error = -ERANGE;
                        return NULL;
                }
                whole = whole * 10 + (uint64_t) (*p - '0');
        }

        /* The fraction is kept as digits so "1.5ms" is exact: frac_num / frac_den. */
        uint64_t frac_num = 0, frac_den = 1;
        if (*p == '.') {
                p++;
                for (; isdigit((unsigned char) *p); p++)
                        if (frac_den < 1000000000000ULL) {
                                frac_num = frac_num * 10 + (uint64_t) (*p - '0');
                                frac_den *= 10;
                        }
                if (p == start + 1)
                        return NULL;
        }

        p = skip_space(p);
        usec_t unit = default_unit;
        for (size_t i = 0; i < ELEMENTSOF(units); i++) {
                size_t n = strlen(units[i].suffix);
                if (strncmp(p, units[i].suffix, n) == 0 && !isalpha((unsigned char) p[n])) {
                        unit = units[i].usec;
                        p += n;
                        goto found;
                }
        }
        if (isalpha((unsigned char) *p))
                return NULL; /* an unknown unit */
        if (*p && !isspace((unsigned char) p[-1]))
                return NULL; /* "1.5.5": a bare number runs into the next one */
found:
        *ret_error = -ERANGE;
        if (whole > 0 && unit > UINT64_MAX / whole)
                return NULL;
        usec_t v = whole * unit;
        usec_t f = (usec_t) ((double) frac_num * (double) unit / (double) frac_den);
        if (v > UINT64_MAX - 1 - f)
                return NULL;
        *ret = v + f;
        return p;
}

int timespan_parse(const char *s, usec_t default_unit, usec_t *ret_usec) {
        assert_return(s, -EINVAL);
        assert_return(ret_usec, -EINVAL);

        const char *p = skip_space(s);
        if (strncmp(p, "infinity", 8) == 0 && *skip_space(p + 8) == '\0') {
                *ret_usec = USEC_INFINITY;
                return 0;
        }
        if (*p == '\0' || *p == '-')
                return -EINVAL;

        usec_t total = 0;
        while (*p) {
                usec_t part;
                int r;
                const char *next = parse_component(p, default_unit, &part, &r);
                if (!next)
                        return r;
                if (total > UINT64_MAX - 1 - part)
                        return -ERANGE;
                total += part;
                p = skip_space(next);
        }
        *ret_usec = total;
        return 0;
}

const char *timespan_format(char *buf, size_t size, usec_t t) {
        static const struct {
                const char *suffix;
                usec_t usec;
        } table[] = {
                { "d", USEC_PER_DAY }, { "h", USEC_PER_HOUR }, { "min", USEC_PER_MINUTE },
                { "s", USEC_PER_SEC }, { "ms", USEC_PER_MSEC }, { "us", 1 },
        };

        if (t == USEC_INFINITY) {
                snprintf(buf, size, "infinity");
                return buf;
        }
        if (t == 0) {
                snprintf(buf, size, "0");
                return buf;
        }

        size_t len = 0;
        for (size_t i = 0; i < ELEMENTSOF(table) && t > 0; i++) {
                usec_t n = t / table[i].usec;
                if (n == 0)
                        continue;
                t -= n * table[i].usec;
                int k = snprintf(buf + len, size - len, "%s%llu%s", len > 0 ? " " : "", (unsigned long long) n,
                                 table[i].suffix);
                if (k < 0 || (size_t) k >= size - len)
                        break;
                len += (size_t) k;
        }
        return buf;
}

static usec_t now_clock(clockid_t clock) {
        struct timespec ts;
        if (clock_gettime(clock, &ts) < 0)
                abort(); /* cannot fail for these clocks on Linux */
        return (usec_t) ts.tv_sec * USEC_PER_SEC + (usec_t) ts.tv_nsec / NSEC_PER_USEC;
}

usec_t now_monotonic(void) {
        return now_clock(CLOCK_MONOTONIC);
}

usec_t now_realtime(void) {
        return now_clock(CLOCK_REALTIME);
}

usec_t now_boottime(void) {
        return now_clock(CLOCK_BOOTTIME);
}
