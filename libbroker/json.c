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

/* ---- serializer ----
 * Replies and calls are serialized on every message on both sides: jansson's dump calls its callback per
 * token and snprintf() per integer, which was a fifth of brokerd's main thread in bench-pairs. */

#define SERIALIZE_DEPTH_MAX 2048

typedef struct JsonWriter {
        JsonSink sink;
        void *userdata;
        size_t n;
        char buffer[4096];
} JsonWriter;

static int writer_flush(JsonWriter *w) {
        if (w->n == 0)
                return 0;
        size_t n = w->n;
        w->n = 0;
        return w->sink(w->buffer, n, w->userdata);
}

static int writer_put(JsonWriter *w, const char *data, size_t size) {
        if (size <= sizeof w->buffer - w->n) {
                memcpy(w->buffer + w->n, data, size);
                w->n += size;
                return 0;
        }
        int r = writer_flush(w);
        if (r < 0)
                return r;
        if (size >= sizeof w->buffer)
                return w->sink(data, size, w->userdata);
        memcpy(w->buffer, data, size);
        w->n = size;
        return 0;
}

static int writer_putc(JsonWriter *w, char c) {
        if (w->n == sizeof w->buffer) {
                int r = writer_flush(w);
                if (r < 0)
                        return r;
        }
        w->buffer[w->n++] = c;
        return 0;
}

/* As jansson's dump_string() without JSON_ENSURE_ASCII or JSON_ESCAPE_SLASH: '"', '\\' and the control
 * characters escaped, everything else (UTF-8, which jansson's strings are) copied as it is. */
static int write_string(JsonWriter *w, const char *s, size_t size) {
        const char *run = s;
        int r;

        r = writer_putc(w, '"');
        if (r < 0)
                return r;
        for (size_t i = 0; i < size; i++) {
                unsigned char c = (unsigned char) s[i];
                if (c >= 0x20 && c != '"' && c != '\\')
                        continue;

                char escape[8];
                size_t k = 2;
                escape[0] = '\\';
                switch (c) {
                case '"':  escape[1] = '"'; break;
                case '\\': escape[1] = '\\'; break;
                case '\b': escape[1] = 'b'; break;
                case '\f': escape[1] = 'f'; break;
                case '\n': escape[1] = 'n'; break;
                case '\r': escape[1] = 'r'; break;
                case '\t': escape[1] = 't'; break;
                default:
                        memcpy(escape + 1, "u00", 3);
                        escape[4] = "0123456789ABCDEF"[c >> 4];
                        escape[5] = "0123456789ABCDEF"[c & 15];
                        k = 6;
                }
                r = writer_put(w, run, (size_t) (s + i - run));
                if (r < 0)
                        return r;
                r = writer_put(w, escape, k);
                if (r < 0)
                        return r;
                run = s + i + 1;
        }
        r = writer_put(w, run, (size_t) (s + size - run));
        if (r < 0)
                return r;
        return writer_putc(w, '"');
}

static int write_integer(JsonWriter *w, json_int_t v) {
        char digits[24], *p = digits + sizeof digits;
        /* Through the unsigned magnitude: -INT64_MIN does not exist. */
        uint64_t m = v < 0 ? -(uint64_t) v : (uint64_t) v;
        do {
                *--p = (char) ('0' + m % 10);
                m /= 10;
        } while (m > 0);
        if (v < 0)
                *--p = '-';
        return writer_put(w, p, (size_t) (digits + sizeof digits - p));
}

static int write_value(JsonWriter *w, json_t *v, unsigned depth) {
        int r;

        switch (json_typeof(v)) {
        case JSON_OBJECT: {
                if (depth >= SERIALIZE_DEPTH_MAX)
                        return -ELOOP;
                r = writer_putc(w, '{');
                if (r < 0)
                        return r;
                bool first = true;
                /* jansson's objects iterate in insertion order, as its dump writes them. */
                for (void *i = json_object_iter(v); i; i = json_object_iter_next(v, i)) {
                        if (!first) {
                                r = writer_putc(w, ',');
                                if (r < 0)
                                        return r;
                        }
                        first = false;
                        r = write_string(w, json_object_iter_key(i), json_object_iter_key_len(i));
                        if (r < 0)
                                return r;
                        r = writer_putc(w, ':');
                        if (r < 0)
                                return r;
                        r = write_value(w, json_object_iter_value(i), depth + 1);
                        if (r < 0)
                                return r;
                }
                return writer_putc(w, '}');
        }
        case JSON_ARRAY: {
                if (depth >= SERIALIZE_DEPTH_MAX)
                        return -ELOOP;
                r = writer_putc(w, '[');
                if (r < 0)
                        return r;
                size_t n = json_array_size(v);
                for (size_t i = 0; i < n; i++) {
                        if (i > 0) {
                                r = writer_putc(w, ',');
                                if (r < 0)
                                        return r;
                        }
                        r = write_value(w, json_array_get(v, i), depth + 1);
                        if (r < 0)
                                return r;
                }
                return writer_putc(w, ']');
        }
        case JSON_STRING:
                return write_string(w, json_string_value(v), json_string_length(v));
        case JSON_INTEGER:
                return write_integer(w, json_integer_value(v));
        case JSON_REAL: {
                /* Rare here (no method sends one): jansson's own text, with its precision and its ".0". */
                _cleanup_free_ char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
                if (!s)
                        return -ENOMEM;
                return writer_put(w, s, strlen(s));
        }
        case JSON_TRUE:
                return writer_put(w, "true", 4);
        case JSON_FALSE:
                return writer_put(w, "false", 5);
        case JSON_NULL:
                return writer_put(w, "null", 4);
        }
        return -EINVAL;
}

int json_serialize(const json_t *v, JsonSink sink, void *userdata) {
        JsonWriter w;
        int r;

        assert_return(v, -EINVAL);
        assert_return(sink, -EINVAL);

        w.sink = sink;
        w.userdata = userdata;
        w.n = 0;
        /* jansson's accessors take a json_t *, even the ones that only read. */
        r = write_value(&w, (json_t *) v, 0);
        if (r < 0)
                return r;
        return writer_flush(&w);
}

typedef struct TextBuffer {
        char *data;
        size_t size, allocated;
} TextBuffer;

static int text_buffer_append(const char *data, size_t size, void *userdata) {
        TextBuffer *b = userdata;
        /* One byte more for the NUL that ends the text. */
        if (size >= b->allocated - b->size) {
                size_t a = MAX(b->allocated * 2, b->size + size + 1);
                char *p = realloc(b->data, a);
                if (!p)
                        return -ENOMEM;
                b->data = p;
                b->allocated = a;
        }
        memcpy(b->data + b->size, data, size);
        b->size += size;
        return 0;
}

int json_format(const json_t *v, char **ret, size_t *ret_size) {
        TextBuffer b = {};
        int r;

        assert_return(v, -EINVAL);
        assert_return(ret, -EINVAL);

        r = json_serialize(v, text_buffer_append, &b);
        if (r >= 0 && !b.data)
                r = text_buffer_append("", 0, &b);
        if (r < 0) {
                free(b.data);
                return r;
        }
        b.data[b.size] = 0;
        if (ret_size)
                *ret_size = b.size;
        *ret = b.data;
        return 0;
}
