/* SPDX-License-Identifier: MIT */
/* json.c — jansson helpers: the parameter dispatcher and small builders. */
#include <limits.h>
#include <stdarg.h>

#include "json.h"
#include "strv.h"

char **json_strv_free(char **l) {
        return strv_free(l);
}

static const JsonField *field_find(const JsonField table[], const char *name) {
        for (const JsonField *f = table; f->name; f++)
                if (streq(f->name, name))
                        return f;
        return NULL;
}

static bool string_ok(const json_t *v, size_t max_length) {
        if (!json_is_string(v))
                return false;
        size_t n = json_string_length(v);
        /* The parser accepts \u0000 so that it can be refused here, by name, rather than as a broken message. */
        return n <= max_length && strlen(json_string_value(v)) == n;
}

static void int_range(const JsonField *f, int64_t *ret_min, int64_t *ret_max) {
        int64_t lo, hi;

        switch (f->type) {
        case JSON_FIELD_UINT64:
                lo = 0, hi = INT64_MAX;
                break;
        case JSON_FIELD_UNSIGNED:
                lo = 0, hi = UINT_MAX;
                break;
        default:
                lo = INT64_MIN, hi = INT64_MAX;
        }
        if (f->min != 0 || f->max != 0) {
                lo = MAX(lo, f->min);
                hi = MIN(hi, f->max);
        }
        *ret_min = lo;
        *ret_max = hi;
}

static bool field_value_ok(const JsonField *f, const json_t *v) {
        size_t cap = f->max_length; /* 0: the default for the type */

        switch (f->type) {
        case JSON_FIELD_STRING:
                return string_ok(v, cap > 0 ? cap : JSON_STRING_MAX_DEFAULT);
        case JSON_FIELD_BOOL:
                return json_is_boolean(v);
        case JSON_FIELD_INT64:
        case JSON_FIELD_UINT64:
        case JSON_FIELD_UNSIGNED: {
                int64_t lo, hi;

                if (!json_is_integer(v)) /* 1.0 is a real: refused where an integer is asked for */
                        return false;
                int_range(f, &lo, &hi);
                json_int_t i = json_integer_value(v);
                return i >= lo && i <= hi;
        }
        case JSON_FIELD_OBJECT:
                return json_is_object(v);
        case JSON_FIELD_ARRAY:
                return json_is_array(v) && json_array_size(v) <= (cap > 0 ? cap : JSON_ARRAY_MAX_DEFAULT);
        case JSON_FIELD_STRV: {
                size_t i;
                json_t *e;

                if (!json_is_array(v) || json_array_size(v) > (cap > 0 ? cap : JSON_ARRAY_MAX_DEFAULT))
                        return false;
                json_array_foreach(v, i, e)
                        if (!string_ok(e, JSON_STRING_MAX_DEFAULT))
                                return false;
                return true;
        }
        default:
                return false;
        }
}

static int strv_from_json(const json_t *v, char ***ret) {
        size_t n = json_array_size(v), i;
        json_t *e;

        _cleanup_(json_strv_freep) char **l = calloc(n + 1, sizeof(char *));
        if (!l)
                return -ENOMEM;
        json_array_foreach(v, i, e) {
                l[i] = strdup(json_string_value(e));
                if (!l[i])
                        return -ENOMEM;
        }
        *ret = TAKE_PTR(l);
        return 0;
}

int json_dispatch(json_t *object, const JsonField table[], JsonDispatchFlags flags, const char **reterr_parameter) {
        const char *key;
        json_t *v;
        size_t n_strv = 0, k = 0;
        int r;

        assert_return(!object || json_is_object(object), -EINVAL);
        assert_return(table, -EINVAL);

        /* Pass 1 validates everything, so that a bad call leaves the caller's variables as they were. */
        for (const JsonField *f = table; f->name; f++) {
                assert_return(f->type >= 0 && f->type < _JSON_FIELD_TYPE_MAX, -EINVAL);
                assert_return(f->destination, -EINVAL);

                v = json_object_get(object, f->name);
                bool absent = !v || json_is_null(v);
                if (absent ? (f->flags & JSON_MANDATORY) : !field_value_ok(f, v)) {
                        if (reterr_parameter)
                                *reterr_parameter = f->name;
                        return -EINVAL;
                }
                if (!absent && f->type == JSON_FIELD_STRV)
                        n_strv++;
        }

        if (!(flags & JSON_DISPATCH_ALLOW_UNKNOWN))
                json_object_foreach(object, key, v)
                        if (!field_find(table, key)) {
                                if (reterr_parameter)
                                        *reterr_parameter = key;
                                return -EINVAL;
                        }

        /* Pass 2 makes the copies that can fail, pass 3 cannot fail. */
        char ***copies = NULL;
        if (n_strv > 0) {
                copies = calloc(n_strv, sizeof(char **));
                if (!copies)
                        return -ENOMEM;
                for (const JsonField *f = table; f->name; f++) {
                        if (f->type != JSON_FIELD_STRV)
                                continue;
                        v = json_object_get(object, f->name);
                        if (!v || json_is_null(v))
                                continue;
                        r = strv_from_json(v, &copies[k]);
                        if (r < 0) {
                                for (size_t j = 0; j < k; j++)
                                        json_strv_free(copies[j]);
                                free(copies);
                                return r;
                        }
                        k++;
                }
        }

        k = 0;
        for (const JsonField *f = table; f->name; f++) {
                v = json_object_get(object, f->name);
                if (!v || json_is_null(v))
                        continue;

                switch (f->type) {
                case JSON_FIELD_STRING:
                        *(const char **) f->destination = json_string_value(v);
                        break;
                case JSON_FIELD_BOOL:
                        *(bool *) f->destination = json_is_true(v);
                        break;
                case JSON_FIELD_INT64:
                        *(int64_t *) f->destination = json_integer_value(v);
                        break;
                case JSON_FIELD_UINT64:
                        *(uint64_t *) f->destination = (uint64_t) json_integer_value(v);
                        break;
                case JSON_FIELD_UNSIGNED:
                        *(unsigned *) f->destination = (unsigned) json_integer_value(v);
                        break;
                case JSON_FIELD_OBJECT:
                case JSON_FIELD_ARRAY:
                        *(json_t **) f->destination = v;
                        break;
                case JSON_FIELD_STRV: {
                        char ***d = f->destination;
                        json_strv_free(*d);
                        *d = copies[k++];
                        break;
                }
                default:
                        break;
                }
        }
        free(copies);
        return 0;
}

int json_parse_object(const void *data, size_t size, json_t **ret) {
        json_error_t error;

        assert_return(data || size == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        json_t *v = json_loadb(data ?: "", size, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &error);
        if (!v)
                return json_error_code(&error) == json_error_out_of_memory ? -ENOMEM : -EBADMSG;
        if (!json_is_object(v)) {
                json_decref(v);
                return -EBADMSG;
        }
        *ret = v;
        return 0;
}

int json_build(json_t **ret, const char *fmt, ...) {
        json_error_t error;
        va_list ap;

        assert_return(ret, -EINVAL);
        assert_return(fmt, -EINVAL);

        va_start(ap, fmt);
        json_t *v = json_vpack_ex(&error, 0, fmt, ap);
        va_end(ap);
        if (!v)
                return json_error_code(&error) == json_error_out_of_memory ? -ENOMEM : -EINVAL;
        *ret = v;
        return 0;
}

int json_strv_new(char *const *l, json_t **ret) {
        assert_return(ret, -EINVAL);

        _cleanup_(json_decrefp) json_t *a = json_array();
        if (!a)
                return -ENOMEM;
        for (char *const *i = l; i && *i; i++) {
                json_t *s = json_string(*i);
                if (!s) {
                        /* Tell invalid UTF-8 from a failed allocation: the unchecked variant only allocates. */
                        s = json_string_nocheck(*i);
                        bool oom = !s;
                        json_decref(s);
                        return oom ? -ENOMEM : -EINVAL;
                }
                if (json_array_append_new(a, s) < 0)
                        return -ENOMEM;
        }
        *ret = TAKE_PTR(a);
        return 0;
}

int json_format(const json_t *v, char **ret, size_t *ret_size) {
        assert_return(v, -EINVAL);
        assert_return(ret, -EINVAL);

        char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!s)
                return -ENOMEM;
        if (ret_size)
                *ret_size = strlen(s);
        *ret = s;
        return 0;
}
