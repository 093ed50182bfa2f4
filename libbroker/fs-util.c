/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "fs-util.h"
#include "macro.h"

int mkdir_parents(const char *path, mode_t mode) {
        assert_return(path, -EINVAL);

        _cleanup_free_ char *p = strdup(path);
        if (!p)
                return -ENOMEM;
        for (char *s = p + 1; (s = strchr(s, '/')); s++) {
                *s = '\0';
                if (mkdir(p, mode) < 0 && errno != EEXIST)
                        return negative_errno();
                *s = '/';
        }
        return 0;
}
