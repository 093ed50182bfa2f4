/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "strv.h"

char **strv_free(char **l) {
        for (char **i = l; i && *i; i++)
                free(*i);
        free(l);
        return NULL;
}

size_t strv_length(char *const *l) {
        size_t n = 0;
        while (l && l[n])
                n++;
        return n;
}

bool strv_contains(char *const *l, const char *s) {
        for (; l && *l; l++)
                if (streq(*l, s))
                        return true;
        return false;
}

char **strv_copy(char *const *l) {
        if (!l)
                return NULL;
        size_t n = strv_length(l);
        char **c = calloc(n + 1, sizeof(char *));
        if (!c)
                return NULL;
        for (size_t i = 0; i < n; i++)
                if (!(c[i] = strdup(l[i])))
                        return strv_free(c);
        return c;
}

static int str_compare(const void *a, const void *b) {
        return strcmp(*(const char *const *) a, *(const char *const *) b);
}

int strv_join_sorted(char *const *l, const char *sep, char **ret) {
        size_t n = strv_length(l), len = 1;
        _cleanup_free_ const char **sorted = calloc(n + 1, sizeof(char *));
        if (!sorted)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                sorted[i] = l[i];
                len += strlen(l[i]) + strlen(sep);
        }
        qsort(sorted, n, sizeof(char *), str_compare);
        char *s = malloc(len), *e = s;
        if (!s)
                return -ENOMEM;
        *e = '\0';
        for (size_t i = 0; i < n; i++) {
                if (i > 0 && streq(sorted[i], sorted[i - 1]))
                        continue;
                if (e > s)
                        e = stpcpy(e, sep);
                e = stpcpy(e, sorted[i]);
        }
        *ret = s;
        return 0;
}

typedef struct Strided {
        const void *first;
        size_t stride;
} Strided;

static const char *strided_name(const Strided *s, size_t i) {
        return *(char *const *) ((const char *) s->first + i * s->stride);
}

static int strided_compare(const void *a, const void *b, void *userdata) {
        size_t x = *(const size_t *) a, y = *(const size_t *) b;
        int c = strcmp(strided_name(userdata, x), strided_name(userdata, y));
        return c != 0 ? c : (x > y) - (x < y);
}

void strv_order_sort(size_t *order, size_t n, const void *first, size_t stride) {
        if (n > 1)
                qsort_r(order, n, sizeof(size_t), strided_compare, &(Strided) { first, stride });
}

int strv_compare_n(const char *s, const char *name, size_t len) {
        for (size_t i = 0; i < len; i++) {
                unsigned char a = (unsigned char) s[i], b = (unsigned char) name[i];
                if (a == '\0')
                        return -1; /* s is shorter (or name has a NUL byte here, which s cannot) */
                if (a != b)
                        return a < b ? -1 : 1;
        }
        return s[len] != '\0';
}

size_t strv_order_lower_bound_n(const size_t *order, size_t n, const void *first, size_t stride, const char *name,
                                size_t len) {
        const Strided s = { first, stride };
        size_t lo = 0, hi = n;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (strv_compare_n(strided_name(&s, order[mid]), name, len) < 0)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return lo;
}

size_t strv_order_lower_bound(const size_t *order, size_t n, const void *first, size_t stride, const char *name) {
        return strv_order_lower_bound_n(order, n, first, stride, name, strlen(name));
}
