/* SPDX-License-Identifier: MIT */
/* resp.c — checked accessors of a Redis reply (resp.h). */
#include <stdlib.h>
#include <string.h>

#include "resp.h"

bool resp_is(const RespValue *v, const char *word) {
        return v && word && v->type == RESP_STRING && strlen(word) == v->len && memcmp(v->str, word, v->len) == 0;
}

bool resp_int(const RespValue *v, int64_t *ret) {
        if (!v)
                return false;
        if (v->type == RESP_INTEGER) {
                *ret = v->integer;
                return true;
        }
        if (v->type != RESP_STRING || v->len == 0 || v->len > 20)
                return false;
        char buf[24], *end;
        memcpy(buf, v->str, v->len);
        buf[v->len] = 0;
        errno = 0;
        long long x = strtoll(buf, &end, 10);
        if (errno != 0 || *end)
                return false;
        *ret = x;
        return true;
}

const RespValue *resp_at(const RespValue *v, size_t i) {
        return v && v->type == RESP_ARRAY && i < v->n ? &v->elements[i] : NULL;
}

char *resp_strdup(const RespValue *v) {
        if (!v || v->type != RESP_STRING)
                return NULL;
        return strndup(v->str, v->len);
}

char *resp_strdup_max(const RespValue *v, size_t max) {
        return v && v->type == RESP_STRING && v->len <= max ? resp_strdup(v) : NULL;
}
