/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"

int log_max_level = LOG_INFO;
static bool log_prefix_priority;

void log_setup(void) {
        const char *e = getenv("SYSTEMD_LOG_LEVEL");
        if (e && streq(e, "debug"))
                log_max_level = LOG_DEBUG;

        /* Under systemd, stderr is a journal stream: "<N>" prefixes carry the priority. */
        e = getenv("JOURNAL_STREAM");
        if (e) {
                unsigned long dev, ino;
                struct stat st;
                if (sscanf(e, "%lu:%lu", &dev, &ino) == 2 && fstat(STDERR_FILENO, &st) == 0 &&
                    st.st_dev == (dev_t) dev && st.st_ino == (ino_t) ino)
                        log_prefix_priority = true;
        }
}

int log_internal(int level, int error, const char *format, ...) {
        char buf[2048];
        va_list ap;
        int saved = errno;

        errno = abs(error);
        va_start(ap, format);
        vsnprintf(buf, sizeof buf, format, ap);
        va_end(ap);
        errno = saved;

        if (log_prefix_priority)
                fprintf(stderr, "<%d>%s\n", level, buf);
        else
                fprintf(stderr, "brokerd: %s\n", buf);
        return -abs(error);
}
