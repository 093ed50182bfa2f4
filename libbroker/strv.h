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
