/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fs-util.h"
#include "macro.h"
#include "state-damage.h"

/* Appended, never replaced: a damage found earlier and not yet cleared by its operator keeps its lines. */
int state_damage_record(const char *directory, const char *what, const char *damage, size_t size, usec_t realtime) {
        _cleanup_free_ char *path = NULL, *head = NULL;
        char when[32] = "?";
        struct tm tm;
        time_t t = (time_t) (realtime / USEC_PER_SEC);

        if (gmtime_r(&t, &tm))
                (void) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
        if (asprintf(&path, "%s/" STATE_DAMAGE_FILE, directory) < 0 ||
            asprintf(&head,
                     "# brokerd, %s: %s\n"
                     "# What it held is not known: nothing new is granted while this file exists.\n"
                     "# Remove it once no job holds a slot or member that `slotctl status` does not show, and the\n"
                     "# drains and quarantines it shows are right (brokerd(8), RESTART BEHAVIOUR).\n",
                     when, what) < 0)
                return -ENOMEM;
        _cleanup_close_ int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOCTTY, 0600);
        if (fd < 0)
                return -errno;
        int r = fd_write_all(fd, head, strlen(head));
        if (r == 0 && size > 0)
                r = fd_write_all(fd, damage, size);
        if (r < 0)
                return r;
        if (fsync(fd) < 0)
                return -errno;
        _cleanup_close_ int dfd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || fsync(dfd) < 0)
                return -errno;
        return 0;
}

int state_damage_found(const char *directory) {
        _cleanup_free_ char *path = NULL;
        if (asprintf(&path, "%s/" STATE_DAMAGE_FILE, directory) < 0)
                return -ENOMEM;
        if (access(path, F_OK) == 0)
                return 1;
        return errno == ENOENT ? 0 : -errno;
}
