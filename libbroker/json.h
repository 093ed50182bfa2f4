/* SPDX-License-Identifier: MIT */
/* json.h — jansson helpers: parameter objects checked against a table, small builders, and the parser and
 * serializer of the wire (faster than jansson's own, same text). */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "macro.h"

/* jansson ships json_decrefp() for _cleanup_(json_decrefp) json_t *v = NULL; */

/* Caps that apply when a table entry leaves max_length at 0. */
#define JSON_STRING_MAX_DEFAULT ((size_t) 4096)
#define JSON_ARRAY_MAX_DEFAULT ((size_t) 4096)

typedef enum JsonFieldType {
        JSON_FIELD_STRING,   /* const char **: borrowed from the object; no NUL inside, ≤ max_length bytes */
        JSON_FIELD_BOOL,     /* bool * */
        JSON_FIELD_INT64,    /* int64_t *: an integer (not a real) within [min, max] */
        JSON_FIELD_UINT64,   /* uint64_t *: likewise, never negative */
        JSON_FIELD_UNSIGNED, /* unsigned *: likewise, ≤ UINT_MAX */
        JSON_FIELD_OBJECT,   /* json_t **: borrowed */
        JSON_FIELD_ARRAY,    /* json_t **: borrowed, ≤ max_length elements */
        JSON_FIELD_STRV,     /* char ***: a new NULL-terminated copy, ≤ max_length elements, each string
                              * as for JSON_FIELD_STRING (≤ JSON_STRING_MAX_DEFAULT); the old value is freed */
        _JSON_FIELD_TYPE_MAX,
        _JSON_FIELD_TYPE_INVALID = -EINVAL,
} JsonFieldType;

typedef enum JsonFieldFlags {
        JSON_MANDATORY = 1 << 0, /* absent or null is an error; otherwise both leave the destination alone */
} JsonFieldFlags;

/* One entry of a dispatch table; a table ends with an entry whose name is NULL.
 * Integer ranges: min == max == 0 means the type's whole range (jansson itself reads no integer beyond
 * int64, so UINT64 tops out at INT64_MAX). */
typedef struct JsonField {
        const char *name;
        JsonFieldType type;
        JsonFieldFlags flags;
        void *destination;
        int64_t min, max;
        size_t max_length;
} JsonField;

typedef enum JsonDispatchFlags {
        JSON_DISPATCH_ALLOW_UNKNOWN = 1 << 0, /* ignore keys the table does not name (replies from newer servers) */
} JsonDispatchFlags;

/* Checks every key of object (NULL counts as {}) against table, then stores the values. Nothing is
 * written unless everything is valid. Returns 0; -EINVAL for an unknown key, a missing mandatory one,
 * a wrong type, a number out of range, a string with a NUL or over its cap — and then points
 * *reterr_parameter (if not NULL) at the offending name, for InvalidParameter (borrowed from the table
 * or the object); -ENOMEM. */
int json_dispatch(json_t *object, const JsonField table[], JsonDispatchFlags flags, const char **reterr_parameter);

/* Parses exactly size bytes as one JSON object (NUL escapes allowed in strings, duplicate keys refused).
 * Returns 0; -EBADMSG for malformed JSON or a value that is not an object; -ENOMEM. */
int json_parse_object(const void *data, size_t size, json_t **ret);

/* The members of one object read in order, without building the object: for a message whose envelope is
 * read into fields (a Varlink call's method and flags) and only its parameters built as a tree. The
 * grammar, limits and errors of json_parse_object(), but duplicate keys, which the caller tells apart
 * (the keys it knows are few). Fields private. */
typedef struct JsonParser {
        const char *p, *end;
        unsigned depth;
} JsonParser;
typedef struct JsonMembers {
        JsonParser parser;
        bool after_first;
} JsonMembers;

/* Starts at the object that data holds exactly: 0, -EBADMSG when it does not start with '{'. */
int json_members_begin(JsonMembers *m, const void *data, size_t size);
/* The next member's key (as parse gives it: into data, or decoded into *ret_allocated, to be freed). Returns
 * 1; 0 once the object ended and nothing but blanks follows it; -EBADMSG. The value must be read next. */
int json_members_next(JsonMembers *m, const char **ret_key, size_t *ret_size, char **ret_allocated);
/* The member's value as a tree: 0, -EBADMSG, -ENOMEM. */
int json_members_value(JsonMembers *m, json_t **ret);
/* The member's value when it is a string, without a tree: 1 and the string (as json_members_next()'s key),
 * -EBADMSG; 0, with nothing read, when it is no string (read it with json_members_value()). */
int json_members_string(JsonMembers *m, const char **ret, size_t *ret_size, char **ret_allocated);

/* json_pack() that returns an errno: 0; -ENOMEM; -EINVAL for a bad format or a NULL where the format
 * wants a value (use "s?"/"o?" for optional ones). */
int json_build(json_t **ret, const char *fmt, ...);

/* A JSON array of the strings of l (NULL: an empty array). Returns 0; -EINVAL for a string that is not
 * UTF-8; -ENOMEM. */
int json_strv_new(char *const *l, json_t **ret);

/* Frees a NULL-terminated string array as JSON_FIELD_STRV allocates it; returns NULL. */
char **json_strv_free(char **l);
DEFINE_TRIVIAL_CLEANUP_FUNC(char **, json_strv_free);

/* Compact JSON text of v (json_serialize()'s), NUL-terminated (every control character is escaped, NUL
 * included, so the text has no NUL of its own). *ret_size counts the bytes without the NUL. Returns 0,
 * -ENOMEM or -ELOOP. */
int json_format(const json_t *v, char **ret, size_t *ret_size);

/* Receives serialized text in pieces; returns 0 or a negative errno that stops the serialization. */
typedef int (*JsonSink)(const char *data, size_t size, void *userdata);

/* Compact JSON text of v, byte for byte what json_dump_callback(v, …, JSON_COMPACT | JSON_ENCODE_ANY)
 * produces, handed to sink in pieces of up to 4 KiB (batched on the stack: one sink call for a short
 * message, where jansson calls it per token and formats every integer with snprintf()). Returns 0; the
 * sink's error; -ELOOP for containers nested deeper than 2048 (a cycle); -ENOMEM. */
int json_serialize(const json_t *v, JsonSink sink, void *userdata);

/* Compact JSON text written straight, value by value, for the messages sent on every request (a grant, a
 * position): the bytes json_serialize() writes for the tree the same calls would build (keys in the order
 * written), without building it. Short texts stay in the inline buffer. Errors are kept, not returned, and
 * every call after one does nothing: json_text_result() says. Nesting is at most 64 deep. */
typedef struct JsonText {
        char *data;             /* inline_buffer, or allocated once that is full */
        size_t size, allocated;
        unsigned depth;
        uint64_t non_empty;     /* bit d: the container at depth d + 1 has a member already */
        bool after_key;
        int error;
        char inline_buffer[512];
} JsonText;

void json_text_init(JsonText *t);
void json_text_done(JsonText *t); /* _cleanup_(json_text_done) JsonText t; */
/* '{' or '[' opens, '}' or ']' closes. */
void json_text_open(JsonText *t, char bracket);
void json_text_close(JsonText *t, char bracket);
/* An object's key, a name of the code's own (ASCII, printable, no '"' or '\\': written as it is); the next
 * call writes its value. */
void json_text_key(JsonText *t, const char *key);
/* A string: UTF-8 (else -EINVAL, as jansson's json_string() refuses it), escaped as json_serialize() does. */
void json_text_string(JsonText *t, const char *s);
void json_text_integer(JsonText *t, int64_t v);
void json_text_bool(JsonText *t, bool b);
/* 0 when the text is whole (every container closed); the first error (-ENOMEM, -EINVAL, -ELOOP). */
int json_text_result(const JsonText *t);
