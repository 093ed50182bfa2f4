/* SPDX-License-Identifier: MIT */
/* varlink.h — Varlink framing (varlink.org): NUL-terminated JSON messages, calls, replies and errors,
 * and a non-blocking stream over a caller's socket. No event loop and no logging here: the daemon drives
 * it from sd-event, the client from poll(). */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "json.h"
#include "macro.h"

/* A call larger than this is refused: what brokerd reads. */
#define VARLINK_CALL_MAX_DEFAULT ((size_t) 64 * 1024)
/* What a client accepts in one reply: a Status of thousands of waiters is larger than a call. */
#define VARLINK_REPLY_MAX_DEFAULT ((size_t) 16 * 1024 * 1024)
/* Bytes queued for a peer that does not read; past it the connection is cut. */
#define VARLINK_OUTPUT_MAX_DEFAULT ((size_t) 16 * 1024 * 1024)
/* One read(): bounds the memory a burst takes before it is parsed. */
#define VARLINK_READ_SIZE ((size_t) 16 * 1024)
/* File descriptors passed with one message (SCM_RIGHTS), and waiting in one stream's input at once: a few,
 * so that a client cannot make the daemon hold fds by the thousand. */
#define VARLINK_FDS_MAX 4
/* The smallest input buffer: it grows by doubling with what is buffered. */
#define VARLINK_INPUT_MIN ((size_t) 256)

#define VARLINK_SERVICE_INTERFACE "org.varlink.service"
#define VARLINK_ERROR_INTERFACE_NOT_FOUND "org.varlink.service.InterfaceNotFound"     /* {interface} */
#define VARLINK_ERROR_METHOD_NOT_FOUND "org.varlink.service.MethodNotFound"           /* {method} */
#define VARLINK_ERROR_METHOD_NOT_IMPLEMENTED "org.varlink.service.MethodNotImplemented" /* {method} */
#define VARLINK_ERROR_INVALID_PARAMETER "org.varlink.service.InvalidParameter"       /* {parameter} */
#define VARLINK_ERROR_PERMISSION_DENIED "org.varlink.service.PermissionDenied"       /* {} */
#define VARLINK_ERROR_EXPECTED_MORE "org.varlink.service.ExpectedMore"               /* {} */

/* The interface definitions served by org.varlink.service.GetInterfaceDescription, verbatim.
 * io.slotbroker's is generated at build time from io.slotbroker.varlink. */
extern const char varlink_interface_org_varlink_service[];
extern const char varlink_interface_io_slotbroker[];

/* Names (varlink.org grammar). An interface is reverse-domain: "io.slotbroker"; a member (method, error,
 * type) starts with an uppercase letter: "Acquire"; a qualified name is both: "io.slotbroker.Acquire". */
bool varlink_interface_name_valid(const char *s);
bool varlink_member_name_valid(const char *s);
bool varlink_qualified_name_valid(const char *s);

/* Splits "io.slotbroker.Acquire" at its last dot, without copying: *ret_interface_len = 13,
 * *ret_member points at "Acquire". Either may be NULL. Returns 0, or -EINVAL for an invalid name. */
int varlink_method_split(const char *method, size_t *ret_interface_len, const char **ret_member);

/* True when method is a member of interface: varlink_method_in_interface("io.slotbroker.Acquire",
 * "io.slotbroker"). Does not validate. */
bool varlink_method_in_interface(const char *method, const char *interface);

typedef enum VarlinkCallFlags {
        VARLINK_CALL_MORE = 1 << 0,    /* the caller takes several replies, all but the last with continues */
        VARLINK_CALL_ONEWAY = 1 << 1,  /* the caller wants no reply at all */
        VARLINK_CALL_UPGRADE = 1 << 2, /* the connection leaves Varlink after the reply */
} VarlinkCallFlags;

typedef enum VarlinkReplyFlags {
        VARLINK_REPLY_CONTINUES = 1 << 0, /* more replies to the same call follow */
} VarlinkReplyFlags;

/* The file descriptors that came with one message, in the order they were sent (SCM_RIGHTS), as systemd's
 * Varlink passes them: a parameter names one by its index. Each is O_CLOEXEC and owned here until taken. */
typedef struct VarlinkFds {
        int fds[VARLINK_FDS_MAX];
        size_t n;               /* fds[0..n) are set; a taken one is -EBADF */
} VarlinkFds;

#define VARLINK_FDS_INIT ((VarlinkFds) { .n = 0 })

/* Closes what was not taken; empty afterwards. Accepts NULL. */
void varlink_fds_close(VarlinkFds *f);
/* Every fd received from a peer that this library closes (not taken, over the limit, with a broken
 * message) is closed by close_fn, process-wide: a daemon closes them off its event loop, since the last
 * close() of a file a peer chose can block (a socket lingering, a FUSE file). NULL: close() here. */
void varlink_set_received_fd_closer(void (*close_fn)(int fd));
/* Takes the index-th fd: the caller owns it from now on. Returns it; -ENXIO when the message carried no fd
 * at index, or it was taken already. */
int varlink_fds_take(VarlinkFds *f, size_t index);

/* A parsed call; everything is borrowed from the message, which must outlive it. */
typedef struct VarlinkCall {
        const char *method;     /* "interface.Method", valid by the grammar */
        json_t *parameters;     /* always an object */
        VarlinkCallFlags flags;
        VarlinkFds *fds;        /* passed with the call, or NULL (varlink_call_message_call() sets NULL): a method
                                 * takes those it uses, and the caller closes the rest after it */
} VarlinkCall;

/* A parsed reply; borrowed from the message like VarlinkCall. */
typedef struct VarlinkReply {
        const char *error;      /* NULL, or the qualified error name */
        json_t *parameters;     /* always an object */
        VarlinkReplyFlags flags;
} VarlinkReply;

/* A call read straight from its bytes: the envelope's fields without the envelope as a tree (brokerd reads
 * one per request), the parameters as one. Owns what it holds; VarlinkCall borrows from it. */
typedef struct VarlinkCallMessage {
        char *method;           /* NULL: none held */
        json_t *parameters;     /* always an object */
        VarlinkCallFlags flags;
} VarlinkCallMessage;

#define VARLINK_CALL_MESSAGE_INIT ((VarlinkCallMessage) { .method = NULL })

/* Parses exactly size bytes as a call: "method" mandatory, a qualified name; "parameters" an object
 * (absent or null: an empty one); "more", "oneway", "upgrade" booleans (null: false), not more with oneway;
 * other keys only as vendor extensions ("org.example.key", containing a dot), read and dropped. Returns 0;
 * -EBADMSG for malformed JSON (what json_parse_object() refuses, a duplicate key included); -EPROTO for
 * JSON that is no call (the caller cannot answer it: it closes); -ENOMEM. *ret untouched on failure. */
int varlink_call_message_parse(const void *data, size_t size, VarlinkCallMessage *ret);
void varlink_call_message_done(VarlinkCallMessage *m); /* empty afterwards, as VARLINK_CALL_MESSAGE_INIT */
/* The call it holds, borrowed (fds NULL). */
VarlinkCall varlink_call_message_call(const VarlinkCallMessage *m);

/* The same for a reply, as a client reads one per answer. */
typedef struct VarlinkReplyMessage {
        char *error;            /* NULL: no error */
        json_t *parameters;     /* always an object; NULL only when empty (VARLINK_REPLY_MESSAGE_INIT) */
        VarlinkReplyFlags flags;
} VarlinkReplyMessage;

#define VARLINK_REPLY_MESSAGE_INIT ((VarlinkReplyMessage) { .error = NULL })

/* As varlink_call_message_parse(), for a reply: "parameters" as a call's; "continues" a boolean; "error"
 * a qualified name, or null (an error is always final); vendor extensions. -EPROTO for JSON that is no reply. */
int varlink_reply_message_parse(const void *data, size_t size, VarlinkReplyMessage *ret);
void varlink_reply_message_done(VarlinkReplyMessage *m);
VarlinkReply varlink_reply_message_reply(const VarlinkReplyMessage *m);

/* Message objects. parameters is borrowed (NULL: {}); it must be an object. Return 0, -EINVAL (an invalid
 * name, more together with oneway, continues on an error), -ENOMEM. */
int varlink_call_new(const char *method, json_t *parameters, VarlinkCallFlags flags, json_t **ret);
int varlink_reply_new(json_t *parameters, VarlinkReplyFlags flags, json_t **ret);
int varlink_error_new(const char *error, json_t *parameters, json_t **ret);

/* Wire bytes: compact JSON and the terminating NUL; *ret_size counts the NUL. Return 0, -EINVAL, -ENOMEM. */
int varlink_message_format(const json_t *msg, char **ret, size_t *ret_size);
int varlink_call_format(const char *method, json_t *parameters, VarlinkCallFlags flags, char **ret, size_t *ret_size);
int varlink_reply_format(json_t *parameters, VarlinkReplyFlags flags, char **ret, size_t *ret_size);
int varlink_error_format(const char *error, json_t *parameters, char **ret, size_t *ret_size);

/* Input: bytes in arbitrary chunks in, whole messages out. Holds at most one partial message besides
 * those not yet taken, gives its memory back whenever it is empty (ten thousand idle connections cost
 * nothing here) and shrinks after a large message. Each byte is scanned for the NUL once and moved at
 * most once: O(n) for any chunking.
 *
 * File descriptors passed along belong to the message that holds the last byte received with them. On a
 * stream socket the kernel hands fds out with the bytes of the sendmsg() that carried them, and a recvmsg()
 * that returns fds ends inside those bytes: a sender that passes fds with the first byte of a message, in a
 * sendmsg() of that message alone (as varlink_output_enqueue_json_with_fds() and sd-varlink do), gets them
 * associated with that message, however the reads cut the stream. */
typedef struct VarlinkInput {
        char *data;
        size_t start;     /* first byte not yet taken */
        size_t scanned;   /* data[start..scanned) holds no NUL */
        size_t end;       /* one past the last byte received */
        size_t allocated;
        size_t max;       /* largest message, without its NUL */
        uint64_t offset;  /* stream position of data[0]: the bytes received before it */
        VarlinkFds fds;   /* received and not yet taken with their message */
        uint64_t fds_at[VARLINK_FDS_MAX]; /* stream position of the last byte received with each */
} VarlinkInput;

/* max_message 0 means VARLINK_CALL_MAX_DEFAULT. */
void varlink_input_init(VarlinkInput *in, size_t max_message);
void varlink_input_done(VarlinkInput *in);
/* Appends a chunk. Returns 0 or -ENOMEM. */
int varlink_input_feed(VarlinkInput *in, const void *data, size_t size);
/* Attaches fds to the last byte fed, as they arrived with it. Takes them in every case (closed on failure).
 * Returns 0; -ETOOMANYREFS when more than VARLINK_FDS_MAX would wait in the input (the connection must be
 * closed); -EINVAL when no byte waits to carry them. */
int varlink_input_feed_fds(VarlinkInput *in, const int *fds, size_t n);
/* Takes the next whole message. Returns 1 and *ret (a new reference); 0 when no whole message is
 * buffered; -EMSGSIZE when a message is longer than max (with or without its NUL yet: it can never
 * become valid, the connection must be closed); -EBADMSG for malformed JSON or a non-object (the
 * message is dropped); -ENOMEM. The fds that came with the message are closed. */
int varlink_input_next(VarlinkInput *in, json_t **ret);
/* As varlink_input_next(), and the fds that came with the message go to *ret_fds (which must be empty);
 * it is left empty when there is no message, or a broken one (whose fds are closed). */
int varlink_input_next_with_fds(VarlinkInput *in, json_t **ret, VarlinkFds *ret_fds);
/* As varlink_input_next_with_fds(), the message read as a call (varlink_call_message_parse()): 1; 0; a
 * message that is no call is taken (its fds closed) and -EPROTO; -EBADMSG, -EMSGSIZE, -ENOMEM as there. */
int varlink_input_next_call_with_fds(VarlinkInput *in, VarlinkCallMessage *ret, VarlinkFds *ret_fds);
/* The same for a reply (fds passed with it are closed): 1; 0; -EPROTO (taken); -EBADMSG, -EMSGSIZE, -ENOMEM. */
int varlink_input_next_reply(VarlinkInput *in, VarlinkReplyMessage *ret);
/* Bytes received and not yet taken as messages: after EOF, nonzero means a truncated message. */
static inline size_t varlink_input_pending(const VarlinkInput *in) {
        return in->end - in->start;
}

/* Output: serialized messages waiting for the socket, capped. A list of chunks rather than one buffer,
 * so that a peer that reads a little at a time never makes us move what is queued; chunks are freed as
 * they are sent and an empty queue costs no memory. */
typedef struct VarlinkChunk VarlinkChunk;
typedef struct VarlinkOutput {
        VarlinkChunk *head, *tail;
        size_t pending;   /* bytes queued and not yet sent */
        size_t max;       /* cap on pending */
} VarlinkOutput;

/* max_pending 0 means VARLINK_OUTPUT_MAX_DEFAULT. */
void varlink_output_init(VarlinkOutput *out, size_t max_pending);
void varlink_output_done(VarlinkOutput *out);
/* Queues bytes as they are (a whole message, NUL included). Returns 0; -ENOBUFS when the pending bytes
 * would exceed the cap (nothing is queued: the daemon cuts such a connection); -ENOMEM. */
int varlink_output_enqueue(VarlinkOutput *out, const void *data, size_t size);
/* Queues the caller's bytes by reference, not copied (a large text sent to many peers): they must stay as they
 * are until release(userdata) runs, once, when they are sent or the queue goes. Returns as
 * varlink_output_enqueue(); release does not run then. */
int varlink_output_enqueue_shared(VarlinkOutput *out, const void *data, size_t size, void (*release)(void *userdata),
                                  void *userdata);
/* Serializes msg straight into the queue, with its NUL. Returns as varlink_output_enqueue(). */
int varlink_output_enqueue_json(VarlinkOutput *out, const json_t *msg);
/* Queues msg with fds to pass along: they go with its first byte, in a sendmsg() that carries this message
 * alone, so that the peer can tell which message they came with. The fds stay the caller's: the queue
 * sends copies (F_DUPFD_CLOEXEC), closed once sent. Returns as varlink_output_enqueue(); -EINVAL for more
 * than VARLINK_FDS_MAX fds; -EBADF for an fd that is not open. */
int varlink_output_enqueue_json_with_fds(VarlinkOutput *out, const json_t *msg, const int *fds, size_t n_fds);
/* A message too large to build at once goes out in parts, as it is produced: the text around its
 * values with varlink_output_enqueue() (the NUL at the very end), each value (of any JSON type) with
 * this, without a NUL. Nothing else may be queued in between. Returns as varlink_output_enqueue(). */
int varlink_output_enqueue_json_part(VarlinkOutput *out, const json_t *value);
/* Sends what is pending with sendmsg(MSG_NOSIGNAL|MSG_DONTWAIT), several chunks a call, keeping what a
 * partial write left.
 * Returns 0 when everything was sent; -EAGAIN when the socket is full and bytes remain (wait for
 * POLLOUT); another negative errno (-EPIPE, -ECONNRESET, …) when the connection is broken. */
int varlink_output_flush(VarlinkOutput *out, int fd);
/* The pending bytes, in order, copied into one buffer (a daemon handing its connections to the next one).
 * Returns 0 (*ret NULL when nothing is pending); -EBUSY when a pending message carries fds (they cannot go
 * as bytes); -ENOMEM. */
int varlink_output_copy(const VarlinkOutput *out, void **ret, size_t *ret_size);
static inline size_t varlink_output_pending(const VarlinkOutput *out) {
        return out->pending;
}

/* A connection: a socket, its input and its output. The fd stays the caller's: varlink_stream_done()
 * does not close it (sd-event or the client owns it). Works on blocking and non-blocking sockets alike:
 * every read and send is MSG_DONTWAIT. */
typedef struct VarlinkStream {
        int fd;
        VarlinkInput input;
        VarlinkOutput output;
        /* The last read took less than it had room for: the socket was empty then. Under level-triggered
         * polling the next read can wait for the next wakeup, which saves a recv() that would say EAGAIN. */
        bool drained;
        /* Reads take the fds passed with messages (recvmsg() with SCM_RIGHTS); otherwise the kernel
         * drops them. Set with varlink_stream_accept_fds(). */
        bool accept_fds;
} VarlinkStream;

/* max_message and max_output 0 mean the defaults (VARLINK_CALL_MAX_DEFAULT, VARLINK_OUTPUT_MAX_DEFAULT). */
void varlink_stream_init(VarlinkStream *s, int fd, size_t max_message, size_t max_output);
void varlink_stream_done(VarlinkStream *s);
/* Lets the stream's reads take file descriptors passed with messages (recvmsg(), MSG_CMSG_CLOEXEC), for
 * varlink_stream_next_with_fds(). */
void varlink_stream_accept_fds(VarlinkStream *s, bool accept);
/* One recv() into the input, of at most what a message could still take: the buffered bytes and the
 * read together never exceed max_message + 1. Returns the number of bytes (> 0); 0 at EOF; -EAGAIN when nothing is there; -ENOBUFS when messages not yet taken fill the input (take them
 * with varlink_stream_next() first, or stop reading); -ETOOMANYREFS when the peer passed more fds than
 * VARLINK_FDS_MAX with one read or waiting in the input (all of them closed: close the connection); another
 * negative errno (-ECONNRESET, …). */
ssize_t varlink_stream_read(VarlinkStream *s);
/* As varlink_input_next() and varlink_input_next_with_fds(). */
int varlink_stream_next(VarlinkStream *s, json_t **ret);
int varlink_stream_next_with_fds(VarlinkStream *s, json_t **ret, VarlinkFds *ret_fds);
int varlink_stream_next_call_with_fds(VarlinkStream *s, VarlinkCallMessage *ret, VarlinkFds *ret_fds);
int varlink_stream_next_reply(VarlinkStream *s, VarlinkReplyMessage *ret);
/* As varlink_output_enqueue_json(); nothing is sent until varlink_stream_flush(). */
int varlink_stream_enqueue(VarlinkStream *s, const json_t *msg);
/* Queue a call, a reply, an error; parameters borrowed (NULL: {}). Return 0, -EINVAL, -ENOBUFS, -ENOMEM. */
int varlink_stream_call(VarlinkStream *s, const char *method, json_t *parameters, VarlinkCallFlags flags);
/* A call whose parameters are an object's JSON text already written (json_text_*()), with fds or none (as
 * varlink_output_enqueue_json_with_fds() sends them; they stay the caller's): the bytes varlink_call_format()
 * writes for the same object. The text is not checked beyond its braces and NULs. */
int varlink_stream_call_text(VarlinkStream *s, const char *method, const char *parameters, size_t size,
                             VarlinkCallFlags flags, const int *fds, size_t n_fds);
int varlink_stream_reply(VarlinkStream *s, json_t *parameters, VarlinkReplyFlags flags);
/* A reply whose parameters are an object's JSON text already written (json_text_*()): the bytes
 * varlink_stream_reply() queues for the same object. The text is not checked beyond its braces and NULs. */
int varlink_stream_reply_text(VarlinkStream *s, const char *parameters, size_t size, VarlinkReplyFlags flags);
int varlink_stream_reply_error(VarlinkStream *s, const char *error, json_t *parameters);
/* An error whose parameters are one string, as the standard ones: ("…InvalidParameter", "parameter", "slots"). */
int varlink_stream_reply_error_string(VarlinkStream *s, const char *error, const char *key, const char *value);
/* As varlink_output_flush() on the stream's fd. */
int varlink_stream_flush(VarlinkStream *s);
static inline size_t varlink_stream_pending_output(const VarlinkStream *s) {
        return varlink_output_pending(&s->output);
}
static inline size_t varlink_stream_pending_input(const VarlinkStream *s) {
        return varlink_input_pending(&s->input);
}
