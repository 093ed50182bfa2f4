/* SPDX-License-Identifier: MIT */
/* macro.h — the small vocabulary every module shares: cleanup attributes, TAKE_PTR, assert_return. */
#pragma once

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define _cleanup_(f) __attribute__((cleanup(f)))
#define _unused_ __attribute__((unused))
#define _pure_ __attribute__((pure))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _warn_unused_result_ __attribute__((warn_unused_result))
#define _likely_(x) __builtin_expect(!!(x), 1)
#define _unlikely_(x) __builtin_expect(!!(x), 0)
#define _public_ __attribute__((visibility("default")))

#define ELEMENTSOF(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define DIV_ROUND_UP(x, y) (((x) + (y) - 1) / (y))

#define container_of(ptr, type, member) ((type *) ((char *) (ptr) - offsetof(type, member)))

/* Hands ownership out of a _cleanup_ variable: returns the value and leaves the variable empty. */
#define TAKE_PTR(p)                                \
        ({                                         \
                __typeof__(p) _taken_ = (p);       \
                (p) = NULL;                        \
                _taken_;                           \
        })
/* A macro's value as a string literal (a number in a message). */
#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

#define TAKE_FD(fd)                                \
        ({                                         \
                int _taken_fd_ = (fd);             \
                (fd) = -EBADF;                     \
                _taken_fd_;                        \
        })

/* Public entry points check their arguments and return an error rather than crash the caller. */
#define assert_return(expr, r)                     \
        do {                                       \
                if (_unlikely_(!(expr)))           \
                        return (r);                \
        } while (0)

#define DEFINE_TRIVIAL_CLEANUP_FUNC(type, func)    \
        static inline void func##p(type *p) {      \
                if (*p)                            \
                        func(*p);                  \
        }

static inline void freep(void *p) {
        free(*(void **) p);
}
#define _cleanup_free_ _cleanup_(freep)

static inline int safe_close(int fd) {
        if (fd >= 0) {
                int saved = errno;
                (void) close(fd);
                errno = saved;
        }
        return -EBADF;
}
static inline void closep(int *fd) {
        safe_close(*fd);
}
#define _cleanup_close_ _cleanup_(closep)

static inline void *mfree(void *p) {
        free(p);
        return NULL;
}

/* errno as a negative return value, never 0: a failing libc call that forgot errno still fails. */
static inline int negative_errno(void) {
        return errno > 0 ? -errno : -EIO;
}

#define streq(a, b) (strcmp((a), (b)) == 0)

static inline bool streq_ptr(const char *a, const char *b) {
        if (!a || !b)
                return a == b;
        return strcmp(a, b) == 0;
}

/* An enum's name_to_string() and name_from_string() by its table `name##_table` (indexed by the enum,
 * `max` entries, holes NULL), as systemd's string tables: NULL for a value outside it, the enum's
 * _INVALID (-EINVAL) for a string that names none. `scope` is empty, or static. */
#define DEFINE_STRING_TABLE_TO_STRING(scope, name, type, max)                  \
        scope const char *name##_to_string(type i) {                          \
                return i >= 0 && i < (max) ? name##_table[i] : NULL;          \
        }
#define DEFINE_STRING_TABLE_FROM_STRING(scope, name, type, max)                \
        scope type name##_from_string(const char *s) {                        \
                for (int i = 0; s && i < (max); i++)                          \
                        if (name##_table[i] && streq(name##_table[i], s))     \
                                return (type) i;                              \
                return (type) -EINVAL;                                        \
        }
#define DEFINE_STRING_TABLE_LOOKUP(name, type, max)                            \
        DEFINE_STRING_TABLE_TO_STRING(, name, type, max)                       \
        DEFINE_STRING_TABLE_FROM_STRING(, name, type, max)

/* A copy of s, or NULL for NULL, in *ret. Returns 0, or -ENOMEM (*ret untouched then). */
static inline int strdup_or_null(const char *s, char **ret) {
        char *copy = NULL;

        if (s && !(copy = strdup(s)))
                return -ENOMEM;
        *ret = copy;
        return 0;
}
