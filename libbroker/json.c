/* SPDX-License-Identifier: MIT */
/* json.c — jansson helpers: the parameter dispatcher, small builders, and the wire's parser and serializer. */
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>

#include "json.h"
#include "strv.h"

char **json_strv_free(char **l) {
        return strv_free(l);
}

#define DISPATCH_CACHED_MAX 64

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

        /* The object's values found once, by one walk over its keys (a call has a few), instead of a hash
         * lookup per field of the table in each pass: the Acquire's table has a dozen. values[i] is
         * json_object_get(object, table[i].name), keys compared with their length as jansson does. */
        json_t *values[DISPATCH_CACHED_MAX];
        size_t n_fields = 0;
        while (table[n_fields].name)
                n_fields++;
        bool cached = n_fields <= DISPATCH_CACHED_MAX;
        const char *unknown = NULL;
        if (cached) {
                memset(values, 0, n_fields * sizeof(json_t *));
                for (void *i = object ? json_object_iter(object) : NULL; i; i = json_object_iter_next(object, i)) {
                        const char *name = json_object_iter_key(i);
                        size_t len = json_object_iter_key_len(i), j;
                        for (j = 0; j < n_fields; j++)
                                if (strlen(table[j].name) == len && memcmp(table[j].name, name, len) == 0)
                                        break;
                        if (j < n_fields)
                                values[j] = json_object_iter_value(i);
                        else if (!unknown && !field_find(table, name))
                                unknown = name; /* the check below, as it was: by the key's C string */
                }
        }
#define FIELD_VALUE(f) (cached ? values[(f) - table] : json_object_get(object, (f)->name))

        /* Pass 1 validates everything, so that a bad call leaves the caller's variables as they were. */
        for (const JsonField *f = table; f->name; f++) {
                assert_return(f->type >= 0 && f->type < _JSON_FIELD_TYPE_MAX, -EINVAL);
                assert_return(f->destination, -EINVAL);

                v = FIELD_VALUE(f);
                bool absent = !v || json_is_null(v);
                if (absent ? (f->flags & JSON_MANDATORY) : !field_value_ok(f, v)) {
                        if (reterr_parameter)
                                *reterr_parameter = f->name;
                        return -EINVAL;
                }
                if (!absent && f->type == JSON_FIELD_STRV)
                        n_strv++;
        }

        if (!(flags & JSON_DISPATCH_ALLOW_UNKNOWN)) {
                if (cached) {
                        if (unknown) {
                                if (reterr_parameter)
                                        *reterr_parameter = unknown;
                                return -EINVAL;
                        }
                } else
                        json_object_foreach(object, key, v)
                                if (!field_find(table, key)) {
                                        if (reterr_parameter)
                                                *reterr_parameter = key;
                                        return -EINVAL;
                                }
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
                        v = FIELD_VALUE(f);
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
                v = FIELD_VALUE(f);
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
#undef FIELD_VALUE
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
static bool char_needs_escape(unsigned char c) {
        return c < 0x20 || c == '"' || c == '\\';
}

/* The escape of c (char_needs_escape()) into escape; returns its length. */
static size_t char_escape(unsigned char c, char escape[static 8]) {
        escape[0] = '\\';
        switch (c) {
        case '"':  escape[1] = '"'; return 2;
        case '\\': escape[1] = '\\'; return 2;
        case '\b': escape[1] = 'b'; return 2;
        case '\f': escape[1] = 'f'; return 2;
        case '\n': escape[1] = 'n'; return 2;
        case '\r': escape[1] = 'r'; return 2;
        case '\t': escape[1] = 't'; return 2;
        default:
                memcpy(escape + 1, "u00", 3);
                escape[4] = "0123456789ABCDEF"[c >> 4];
                escape[5] = "0123456789ABCDEF"[c & 15];
                return 6;
        }
}

static int write_string(JsonWriter *w, const char *s, size_t size) {
        const char *run = s;
        int r;

        r = writer_putc(w, '"');
        if (r < 0)
                return r;
        for (size_t i = 0; i < size; i++) {
                unsigned char c = (unsigned char) s[i];
                if (!char_needs_escape(c))
                        continue;

                char escape[8];
                size_t k = char_escape(c, escape);
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

/* The decimal digits of v, at the end of digits; returns where they start. */
static char *integer_digits(int64_t v, char digits[static 24]) {
        char *p = digits + 24;
        /* Through the unsigned magnitude: -INT64_MIN does not exist. */
        uint64_t m = v < 0 ? -(uint64_t) v : (uint64_t) v;
        do {
                *--p = (char) ('0' + m % 10);
                m /= 10;
        } while (m > 0);
        if (v < 0)
                *--p = '-';
        return p;
}

static int write_integer(JsonWriter *w, json_int_t v) {
        char digits[24], *p = integer_digits(v, digits);
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

/* ---- text written straight ----
 * The replies sent on every request (a grant, a position) were a jansson tree packed, serialized and
 * freed: a third of brokerd's main thread in bench-pairs (callgrind). The same bytes, without the tree. */

static size_t utf8_sequence_length(const unsigned char *s, size_t n);

static void text_put_slow(JsonText *t, const char *data, size_t size) {
        if (t->error < 0)
                return;
        if (size > t->allocated - t->size) {
                size_t a = MAX(t->allocated * 2, t->size + size);
                char *p = t->data == t->inline_buffer ? malloc(a) : realloc(t->data, a);
                if (!p) {
                        t->error = -ENOMEM;
                        return;
                }
                if (t->data == t->inline_buffer)
                        memcpy(p, t->data, t->size);
                t->data = p;
                t->allocated = a;
        }
        memcpy(t->data + t->size, data, size);
        t->size += size;
}

static inline void text_put(JsonText *t, const char *data, size_t size) {
        /* After an error the text is thrown away (json_text_result()): writing on within the buffer is harmless. */
        if (_likely_(size <= t->allocated - t->size)) {
                memcpy(t->data + t->size, data, size);
                t->size += size;
                return;
        }
        text_put_slow(t, data, size);
}

/* The comma before a value or a key that is not its container's first. */
static void text_separate(JsonText *t) {
        if (t->after_key) {
                t->after_key = false;
                return;
        }
        if (t->depth == 0)
                return;
        uint64_t bit = UINT64_C(1) << (t->depth - 1);
        if (t->non_empty & bit)
                text_put(t, ",", 1);
        t->non_empty |= bit;
}

void json_text_init(JsonText *t) {
        *t = (JsonText) { .allocated = sizeof t->inline_buffer };
        t->data = t->inline_buffer;
}

void json_text_done(JsonText *t) {
        if (t->data != t->inline_buffer)
                free(t->data);
        t->data = NULL;
}

void json_text_open(JsonText *t, char bracket) {
        assert(bracket == '{' || bracket == '[');
        text_separate(t);
        if (t->depth >= 64) {
                t->error = -ELOOP;
                return;
        }
        text_put(t, &bracket, 1);
        t->depth++;
        t->non_empty &= ~(UINT64_C(1) << (t->depth - 1));
}

void json_text_close(JsonText *t, char bracket) {
        assert(bracket == '}' || bracket == ']');
        if (t->depth == 0) {
                t->error = -EINVAL;
                return;
        }
        t->depth--;
        text_put(t, &bracket, 1);
}

void json_text_string(JsonText *t, const char *s) {
        if (!s) {
                t->error = -EINVAL; /* json_pack()'s "s" with NULL */
                return;
        }
        if (t->error < 0)
                return;
        size_t size = strlen(s), mark = t->size;
        text_separate(t);
        text_put(t, "\"", 1);
        const char *run = s;
        for (size_t i = 0; i < size; i++) {
                unsigned char c = (unsigned char) s[i];
                if (c >= 0x80) {
                        /* jansson's json_string() refuses what is not UTF-8: so does this, as the tree did. */
                        size_t k = utf8_sequence_length((const unsigned char *) s + i, size - i);
                        if (k == 0) {
                                t->size = mark;
                                t->error = -EINVAL;
                                return;
                        }
                        i += k - 1;
                        continue;
                }
                if (!char_needs_escape(c))
                        continue;
                char escape[8];
                size_t k = char_escape(c, escape);
                text_put(t, run, (size_t) (s + i - run));
                text_put(t, escape, k);
                run = s + i + 1;
        }
        text_put(t, run, (size_t) (s + size - run));
        text_put(t, "\"", 1);
}

void json_text_key(JsonText *t, const char *key) {
        /* Keys are the code's own names: nothing to escape, nothing to check but that. */
        size_t size = strlen(key);
        assert(!memchr(key, '"', size) && !memchr(key, '\\', size));
        text_separate(t);
        text_put(t, "\"", 1);
        text_put(t, key, size);
        text_put(t, "\":", 2);
        t->after_key = true;
}

void json_text_integer(JsonText *t, int64_t v) {
        char digits[24], *p = integer_digits(v, digits);
        text_separate(t);
        text_put(t, p, (size_t) (digits + sizeof digits - p));
}

void json_text_bool(JsonText *t, bool b) {
        text_separate(t);
        text_put(t, b ? "true" : "false", b ? 4 : 5);
}

int json_text_result(const JsonText *t) {
        if (t->error < 0)
                return t->error;
        if (t->depth != 0 || t->after_key)
                return -EINVAL; /* unfinished */
        return 0;
}

/* ---- parser ----
 * Every message is parsed on both sides. jansson's json_loadb() reads through a character stream with an
 * unget buffer and copies every string twice: 14% of brokerd's main thread in bench-pairs, after the
 * serializer. This one accepts what json_loadb(JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES) accepts for an
 * object or array at the top (a unit test compares the two) and builds the same jansson values, but for
 * one quirk: jansson skips a raw NUL byte right after a number or a literal ({"a":1<NUL>}), this refuses
 * it. No Varlink message holds a raw NUL (it ends the message), so the wire cannot tell. */

/* JsonParser (json.h): the text left to read, and how deep in containers it is. */

static void parser_skip_space(JsonParser *ps) {
        while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
                ps->p++;
}

/* Length of the UTF-8 sequence at s (at most n bytes available), as jansson's utf8_check_full() judges
 * it: no overlong form, no surrogate, nothing above U+10FFFF. 0 when invalid. */
static size_t utf8_sequence_length(const unsigned char *s, size_t n) {
        unsigned char c = s[0];
        size_t k;
        uint32_t v;

        if (c < 0x80)
                return 1;
        if (c >= 0xC2 && c <= 0xDF) {
                k = 2;
                v = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
                k = 3;
                v = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
                k = 4;
                v = c & 0x07;
        } else
                return 0;
        if (k > n)
                return 0;
        for (size_t i = 1; i < k; i++) {
                if ((s[i] & 0xC0) != 0x80)
                        return 0;
                v = (v << 6) | (s[i] & 0x3F);
        }
        if ((k == 3 && v < 0x800) || (k == 4 && v < 0x10000) || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
                return 0;
        return k;
}

static int hex4(const char *s, uint32_t *ret) {
        uint32_t v = 0;
        for (size_t i = 0; i < 4; i++) {
                char c = s[i];
                v <<= 4;
                if (c >= '0' && c <= '9')
                        v |= (uint32_t) (c - '0');
                else if (c >= 'a' && c <= 'f')
                        v |= (uint32_t) (c - 'a' + 10);
                else if (c >= 'A' && c <= 'F')
                        v |= (uint32_t) (c - 'A' + 10);
                else
                        return -EBADMSG;
        }
        *ret = v;
        return 0;
}

static size_t utf8_encode(uint32_t v, char *out) {
        if (v < 0x80) {
                out[0] = (char) v;
                return 1;
        }
        if (v < 0x800) {
                out[0] = (char) (0xC0 | (v >> 6));
                out[1] = (char) (0x80 | (v & 0x3F));
                return 2;
        }
        if (v < 0x10000) {
                out[0] = (char) (0xE0 | (v >> 12));
                out[1] = (char) (0x80 | ((v >> 6) & 0x3F));
                out[2] = (char) (0x80 | (v & 0x3F));
                return 3;
        }
        out[0] = (char) (0xF0 | (v >> 18));
        out[1] = (char) (0x80 | ((v >> 12) & 0x3F));
        out[2] = (char) (0x80 | ((v >> 6) & 0x3F));
        out[3] = (char) (0x80 | (v & 0x3F));
        return 4;
}

/* The string at ps->p (its opening quote). Without an escape — nearly every string here — *ret points into
 * the input and *ret_allocated is NULL; otherwise the decoded text is in *ret_allocated (to be freed). */
static int parse_string(JsonParser *ps, const char **ret, size_t *ret_size, char **ret_allocated) {
        const char *start = ++ps->p, *q = start;
        int r;

        /* The fast path: a run without escape or control character, UTF-8 checked as it goes. */
        while (q < ps->end) {
                unsigned char c = (unsigned char) *q;
                if (c == '"') {
                        *ret = start;
                        *ret_size = (size_t) (q - start);
                        *ret_allocated = NULL;
                        ps->p = q + 1;
                        return 0;
                }
                if (c == '\\')
                        break;
                if (c < 0x20)
                        return -EBADMSG;
                if (c < 0x80)
                        q++;
                else {
                        size_t k = utf8_sequence_length((const unsigned char *) q, (size_t) (ps->end - q));
                        if (k == 0)
                                return -EBADMSG;
                        q += k;
                }
        }
        if (q >= ps->end)
                return -EBADMSG;

        /* With escapes: decoded text is never longer than its source. */
        _cleanup_free_ char *buffer = malloc((size_t) (ps->end - start));
        if (!buffer)
                return -ENOMEM;
        size_t n = (size_t) (q - start);
        memcpy(buffer, start, n);
        while (q < ps->end) {
                unsigned char c = (unsigned char) *q;
                if (c == '"') {
                        *ret = buffer;
                        *ret_size = n;
                        *ret_allocated = TAKE_PTR(buffer);
                        ps->p = q + 1;
                        return 0;
                }
                if (c < 0x20)
                        return -EBADMSG;
                if (c != '\\') {
                        size_t k = utf8_sequence_length((const unsigned char *) q, (size_t) (ps->end - q));
                        if (k == 0)
                                return -EBADMSG;
                        memcpy(buffer + n, q, k);
                        n += k;
                        q += k;
                        continue;
                }
                if (ps->end - q < 2)
                        return -EBADMSG;
                char e = q[1];
                q += 2;
                switch (e) {
                case '"': case '\\': case '/':
                        buffer[n++] = e;
                        break;
                case 'b': buffer[n++] = '\b'; break;
                case 'f': buffer[n++] = '\f'; break;
                case 'n': buffer[n++] = '\n'; break;
                case 'r': buffer[n++] = '\r'; break;
                case 't': buffer[n++] = '\t'; break;
                case 'u': {
                        uint32_t v, low;
                        if (ps->end - q < 4)
                                return -EBADMSG;
                        r = hex4(q, &v);
                        if (r < 0)
                                return r;
                        q += 4;
                        if (v >= 0xDC00 && v <= 0xDFFF)
                                return -EBADMSG;
                        if (v >= 0xD800 && v <= 0xDBFF) {
                                /* A high surrogate needs its low half, escaped, right after it. */
                                if (ps->end - q < 6 || q[0] != '\\' || q[1] != 'u')
                                        return -EBADMSG;
                                r = hex4(q + 2, &low);
                                if (r < 0)
                                        return r;
                                if (low < 0xDC00 || low > 0xDFFF)
                                        return -EBADMSG;
                                q += 6;
                                v = 0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00);
                        }
                        n += utf8_encode(v, buffer + n);
                        break;
                }
                default:
                        return -EBADMSG;
                }
        }
        return -EBADMSG;
}

static bool is_digit(char c) {
        return c >= '0' && c <= '9';
}

/* As jansson's lexer: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?; an integer beyond int64 or a real
 * beyond double's range is an error, not a rounded value. */
static int parse_number(JsonParser *ps, json_t **ret) {
        const char *s = ps->p, *q = s;
        bool real = false;

        if (q < ps->end && *q == '-')
                q++;
        if (q >= ps->end || !is_digit(*q))
                return -EBADMSG;
        if (*q == '0') {
                q++;
                if (q < ps->end && is_digit(*q))
                        return -EBADMSG;
        } else
                while (q < ps->end && is_digit(*q))
                        q++;
        if (q < ps->end && *q == '.') {
                real = true;
                q++;
                if (q >= ps->end || !is_digit(*q))
                        return -EBADMSG;
                while (q < ps->end && is_digit(*q))
                        q++;
        }
        if (q < ps->end && (*q == 'e' || *q == 'E')) {
                real = true;
                q++;
                if (q < ps->end && (*q == '+' || *q == '-'))
                        q++;
                if (q >= ps->end || !is_digit(*q))
                        return -EBADMSG;
                while (q < ps->end && is_digit(*q))
                        q++;
        }

        if (!real) {
                /* 18 digits always fit in an int64. */
                const char *d = *s == '-' ? s + 1 : s;
                if (q - d <= 18) {
                        int64_t v = 0;
                        for (; d < q; d++)
                                v = v * 10 + (*d - '0');
                        json_t *j = json_integer(*s == '-' ? -v : v);
                        if (!j)
                                return -ENOMEM;
                        ps->p = q;
                        *ret = j;
                        return 0;
                }
        }

        /* Reals and long integers (rare here) as jansson converts them: its range checks, and its strtod()
         * that does not follow the locale of the program that loaded libbroker. */
        json_error_t error;
        json_t *j = json_loadb(s, (size_t) (q - s), JSON_DECODE_ANY, &error);
        if (!j)
                return json_error_code(&error) == json_error_out_of_memory ? -ENOMEM : -EBADMSG;
        ps->p = q;
        *ret = j;
        return 0;
}

static bool parser_literal(JsonParser *ps, const char *word, size_t n) {
        if ((size_t) (ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
                return false;
        ps->p += n;
        return true;
}

/* After a member or an element: 1 when `close` ends the object or array (consumed), 0 after a ',' with
 * another to come, -EBADMSG otherwise. */
static int parser_after_element(JsonParser *ps, char close) {
        parser_skip_space(ps);
        if (ps->p >= ps->end)
                return -EBADMSG;
        if (*ps->p == close) {
                ps->p++;
                return 1;
        }
        if (*ps->p != ',')
                return -EBADMSG;
        ps->p++;
        parser_skip_space(ps);
        return 0;
}

static int parse_value(JsonParser *ps, json_t **ret);

/* A member's key and the ':' after it; the value is next. As parse_string() gives it. */
static int parse_member_key(JsonParser *ps, const char **ret, size_t *ret_size, char **ret_allocated) {
        const char *key;
        size_t key_size;
        _cleanup_free_ char *allocated = NULL;
        int r;

        if (ps->p >= ps->end || *ps->p != '"')
                return -EBADMSG;
        r = parse_string(ps, &key, &key_size, &allocated);
        if (r < 0)
                return r;
        /* jansson refuses a NUL in a key even with JSON_ALLOW_NUL. */
        if (memchr(key, 0, key_size))
                return -EBADMSG;
        parser_skip_space(ps);
        if (ps->p >= ps->end || *ps->p != ':')
                return -EBADMSG;
        ps->p++;
        parser_skip_space(ps);
        *ret = key;
        *ret_size = key_size;
        *ret_allocated = TAKE_PTR(allocated);
        return 0;
}

static int parse_object(JsonParser *ps, json_t **ret) {
        int r;

        _cleanup_(json_decrefp) json_t *o = json_object();
        if (!o)
                return -ENOMEM;
        ps->p++;
        parser_skip_space(ps);
        if (ps->p < ps->end && *ps->p == '}') {
                ps->p++;
                *ret = TAKE_PTR(o);
                return 0;
        }
        for (;;) {
                const char *key;
                size_t key_size;
                _cleanup_free_ char *key_allocated = NULL;
                _cleanup_(json_decrefp) json_t *v = NULL;

                r = parse_member_key(ps, &key, &key_size, &key_allocated);
                if (r < 0)
                        return r;
                r = parse_value(ps, &v);
                if (r < 0)
                        return r;
                /* A key seen before replaces its value and leaves the size: a duplicate, found by the one
                 * lookup the insertion makes (a lookup first cost a second hash of every key). */
                size_t size = json_object_size(o);
                if (json_object_setn_new_nocheck(o, key, key_size, TAKE_PTR(v)) < 0)
                        return -ENOMEM;
                if (json_object_size(o) == size)
                        return -EBADMSG;
                r = parser_after_element(ps, '}');
                if (r < 0)
                        return r;
                if (r > 0) {
                        *ret = TAKE_PTR(o);
                        return 0;
                }
        }
}

static int parse_array(JsonParser *ps, json_t **ret) {
        int r;

        _cleanup_(json_decrefp) json_t *a = json_array();
        if (!a)
                return -ENOMEM;
        ps->p++;
        parser_skip_space(ps);
        if (ps->p < ps->end && *ps->p == ']') {
                ps->p++;
                *ret = TAKE_PTR(a);
                return 0;
        }
        for (;;) {
                json_t *v;

                r = parse_value(ps, &v);
                if (r < 0)
                        return r;
                if (json_array_append_new(a, v) < 0)
                        return -ENOMEM;
                r = parser_after_element(ps, ']');
                if (r < 0)
                        return r;
                if (r > 0) {
                        *ret = TAKE_PTR(a);
                        return 0;
                }
        }
}

static int parse_value(JsonParser *ps, json_t **ret) {
        int r;

        if (ps->p >= ps->end)
                return -EBADMSG;
        switch (*ps->p) {
        case '{':
        case '[':
                /* jansson's limit: 2048 levels. */
                if (++ps->depth > JSON_PARSER_MAX_DEPTH)
                        return -EBADMSG;
                r = *ps->p == '{' ? parse_object(ps, ret) : parse_array(ps, ret);
                ps->depth--;
                return r;
        case '"': {
                const char *s;
                size_t n;
                _cleanup_free_ char *allocated = NULL;
                r = parse_string(ps, &s, &n, &allocated);
                if (r < 0)
                        return r;
                json_t *v = json_stringn_nocheck(s, n);
                if (!v)
                        return -ENOMEM;
                *ret = v;
                return 0;
        }
        case 't':
                if (!parser_literal(ps, "true", 4))
                        return -EBADMSG;
                *ret = json_true();
                return 0;
        case 'f':
                if (!parser_literal(ps, "false", 5))
                        return -EBADMSG;
                *ret = json_false();
                return 0;
        case 'n':
                if (!parser_literal(ps, "null", 4))
                        return -EBADMSG;
                *ret = json_null();
                return 0;
        default:
                return parse_number(ps, ret);
        }
}

/* ---- an object's members, one by one ---- */

int json_members_begin(JsonMembers *m, const void *data, size_t size) {
        assert_return(m, -EINVAL);
        assert_return(data || size == 0, -EINVAL);

        *m = (JsonMembers) { .parser = { .p = data ?: "", .end = (const char *) (data ?: "") + size } };
        JsonParser *ps = &m->parser;
        parser_skip_space(ps);
        if (ps->p >= ps->end || *ps->p != '{')
                return -EBADMSG;
        ps->p++;
        ps->depth = 1; /* as parse_value() counts the object it is in */
        parser_skip_space(ps);
        return 0;
}

int json_members_next(JsonMembers *m, const char **ret_key, size_t *ret_size, char **ret_allocated) {
        JsonParser *ps = &m->parser;
        int r;

        assert_return(m && ret_key && ret_size && ret_allocated, -EINVAL);

        if (ps->depth == 0)
                return -EBADMSG; /* read past the end */
        if (!m->after_first) {
                m->after_first = true;
                if (ps->p < ps->end && *ps->p == '}') {
                        ps->p++;
                        r = 1;
                } else
                        r = 0;
        } else
                r = parser_after_element(ps, '}');
        if (r < 0)
                return r;
        if (r > 0) {
                ps->depth = 0;
                parser_skip_space(ps);
                return ps->p == ps->end ? 0 : -EBADMSG;
        }

        r = parse_member_key(ps, ret_key, ret_size, ret_allocated);
        return r < 0 ? r : 1;
}

int json_members_value(JsonMembers *m, json_t **ret) {
        assert_return(m && ret, -EINVAL);
        return parse_value(&m->parser, ret);
}

int json_members_string(JsonMembers *m, const char **ret, size_t *ret_size, char **ret_allocated) {
        JsonParser *ps = &m->parser;

        assert_return(m && ret && ret_size && ret_allocated, -EINVAL);

        if (ps->p >= ps->end || *ps->p != '"')
                return 0;
        int r = parse_string(ps, ret, ret_size, ret_allocated);
        return r < 0 ? r : 1;
}

int json_parse_object(const void *data, size_t size, json_t **ret) {
        JsonParser ps = { .p = data ?: "", .end = (const char *) (data ?: "") + size };
        json_t *v = NULL;
        int r;

        assert_return(data || size == 0, -EINVAL);
        assert_return(ret, -EINVAL);

        parser_skip_space(&ps);
        if (ps.p >= ps.end || (*ps.p != '{' && *ps.p != '['))
                return -EBADMSG;
        r = parse_value(&ps, &v);
        if (r < 0)
                return r;
        parser_skip_space(&ps);
        if (ps.p != ps.end || !json_is_object(v)) {
                json_decref(v);
                return -EBADMSG;
        }
        *ret = v;
        return 0;
}
