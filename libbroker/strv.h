/* SPDX-License-Identifier: MIT */
/* strv.h — NULL-terminated arrays of strings, as the configuration model and the engine keep names. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "macro.h"

/* Frees every string and the array; accepts NULL; returns NULL. */
char **strv_free(char **l);
DEFINE_TRIVIAL_CLEANUP_FUNC(char **, strv_free);
size_t strv_length(char *const *l);
bool strv_contains(char *const *l, const char *s);
/* A deep copy; NULL for NULL and when out of memory (tell them apart by the argument). */
char **strv_copy(char *const *l);
/* The strings sorted (strcmp), each once, joined by sep, in *ret ("" for none or NULL): a canonical text of a
 * set. Returns 0, or -ENOMEM (*ret untouched then). */
int strv_join_sorted(char *const *l, const char *sep, char **ret);

/* An index by name of names kept in an array of structures (or of strings): element i's name is the char * at
 * (const char *) first + i × stride, `first` pointing at element 0's (an array of strings: the array and
 * sizeof(char *)). For look-ups and matches by name in O(log n), where a scan compares every name. */
/* Sorts order[0..n), indices of such names (none NULL), by name, then index. */
void strv_order_sort(size_t *order, size_t n, const void *first, size_t stride);
/* The first position of order[0..n) (strv_order_sort()ed) whose name is ≥ name: n when none is. */
size_t strv_order_lower_bound(const size_t *order, size_t n, const void *first, size_t stride, const char *name);
/* The same for a name of len bytes, not NUL-terminated necessarily (a Redis reply's): NUL bytes in it match no
 * name of the index. */
size_t strv_order_lower_bound_n(const size_t *order, size_t n, const void *first, size_t stride, const char *name,
                                size_t len);
/* strcmp()'s order between s and the len bytes at name: < 0, 0 (equal), > 0; a NUL byte in name sorts after the end
 * of s. */
int strv_compare_n(const char *s, const char *name, size_t len);
