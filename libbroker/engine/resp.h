/* SPDX-License-Identifier: MIT */
/* resp.h — a Redis reply as the engine reads it (no hiredis type crosses into the engine), and accessors
 * that check each value's type and size before they trust it: every reply is untrusted input (SPEC §11). */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A RESP value, as the driver converts hiredis's redisReply. */
typedef enum RespType {
        RESP_NIL,
        RESP_INTEGER,
        RESP_STRING,
        RESP_ARRAY,
        RESP_ERROR,
        _RESP_TYPE_MAX,
        _RESP_TYPE_INVALID = -EINVAL,
} RespType;

typedef struct RespValue {
        RespType type;
        int64_t integer;
        const char *str;                  /* STRING, ERROR; not NUL-terminated necessarily */
        size_t len;
        const struct RespValue *elements; /* ARRAY */
        size_t n;
} RespValue;

/* A STRING of exactly these bytes. v may be NULL (false), as for every accessor here; word too (false). */
bool resp_is(const RespValue *v, const char *word);
/* An INTEGER, or a STRING of a decimal that fits in int64_t (Lua's replies say numbers both ways). */
bool resp_int(const RespValue *v, int64_t *ret);
/* Element i of an ARRAY; NULL when v is none or shorter. */
const RespValue *resp_at(const RespValue *v, size_t i);
/* A STRING's copy, NUL-terminated; NULL when v is not a STRING or out of memory. */
char *resp_strdup(const RespValue *v);
/* The same, NULL too when it is longer than max bytes. */
char *resp_strdup_max(const RespValue *v, size_t max);
