/* SPDX-License-Identifier: MIT */
/* connection.h — one client socket: Varlink framing, its limits, the peer's credentials, the output and
 * the fds passed with a call. It knows no method, lease or waiter: its owner binds handlers (a call, the
 * end of the client's input, the disconnect), as sd-varlink's bind_method/bind_disconnect do, with one
 * userdata. Calls are run in order; a call the owner defers waits in the input, with those behind it, until
 * connection_resume(). */
#pragma once

#include <stdbool.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "poller.h"
#include "time-util.h"
#include "varlink.h"

typedef struct Connection Connection;

typedef enum ConnectionCallResult {
        CONNECTION_CALL_DONE,   /* run: answered now, or later by the owner */
        CONNECTION_CALL_DEFER,  /* not now: kept, and offered again after connection_resume() */
} ConnectionCallResult;

/* A call; call->fds are its own (the handler takes what it uses, the rest close after it). The handler may
 * close the connection. */
typedef ConnectionCallResult (*ConnectionCallFn)(Connection *c, const VarlinkCall *call, void *userdata);
/* The client shut its sending side; called whenever the connection looks whether it is finished, and may
 * close it. Without one, the connection closes once every call is answered and the output is out. */
typedef void (*ConnectionInputEndedFn)(Connection *c, void *userdata);
/* Runs once, from connection_close() (the client went, its input was bad, it did not read, or the owner
 * closed it), after the socket left the poller and before the socket and buffers are freed. */
typedef void (*ConnectionDisconnectFn)(Connection *c, void *userdata);

typedef struct ConnectionLimits {
        size_t max_message;     /* a longer incoming message is a ProtocolError ("too-long") */
        size_t max_output;      /* unsent output past this closes the connection (SPEC §10) */
} ConnectionLimits;

/* Takes ownership of fd (an accepted socket; closed on failure). cred: its peer's credentials as the caller
 * read them (SO_PEERCRED), or NULL to read them here. Returns 0 or negative errno. */
int connection_new(Poller *poller, int fd, const struct ucred *cred, const ConnectionLimits *limits,
                   Connection **ret);
/* Only once closed: the owner frees it when nothing up the stack can name it any more. */
Connection *connection_free(Connection *c);

void connection_bind_call(Connection *c, ConnectionCallFn fn);
void connection_bind_input_ended(Connection *c, ConnectionInputEndedFn fn);
void connection_bind_disconnect(Connection *c, ConnectionDisconnectFn fn);
void connection_set_userdata(Connection *c, void *userdata);
void *connection_get_userdata(const Connection *c);

/* The peer as SO_PEERCRED saw it at accept. */
const struct ucred *connection_get_peer(const Connection *c);
/* CLOCK_BOOTTIME when this brokerd took the connection (accepted, or handed over): its peer's process ran by
 * then, so a process of the peer's pid started later is another one (pid reuse: process_check_attachable()). */
usec_t connection_get_peer_since(const Connection *c);
/* A connection handed over: since when the brokerd before had it (the same boot), if earlier. */
void connection_set_peer_since(Connection *c, usec_t since);
/* Its supplementary groups and its primary group. */
size_t connection_get_groups(const Connection *c, const gid_t **ret);

/* Queue a reply or an error; a connection whose unsent output passes its cap is closed. Replies of a
 * oneway call (connection_set_oneway()) are dropped. Return 0 or negative errno (-ENOTCONN once closed). */
int connection_reply(Connection *c, json_t *parameters, bool continues);
int connection_reply_error(Connection *c, const char *error, json_t *parameters);
/* A reply whose parameters are a JSON object's text (json_text_*()), as varlink_stream_reply_text(). */
int connection_reply_text(Connection *c, const char *parameters, size_t size, bool continues);
/* As connection_reply_text(), but the reply may wait: it leaves with the next reply that is not deferred, or
 * at connection_send_deferred(). For a notice that news often overtakes at once (a waiter's first "queued",
 * its grant): one send, and one wakeup of the client, instead of two. */
int connection_reply_text_deferred(Connection *c, const char *parameters, size_t size, bool continues);
/* Sends what deferred replies left waiting; nothing if they left already. May close the connection. */
void connection_send_deferred(Connection *c);
/* The call being run wants no reply (or, false, wants one after all). */
void connection_set_oneway(Connection *c, bool oneway);
bool connection_get_oneway(const Connection *c);

/* A reply produced in parts as the client reads (History's): raw text, and JSON values without their
 * NUL (varlink_output_enqueue_json_part()); the last part ends with the NUL. Nothing else may be queued
 * meanwhile: the owner holds the calls behind it (connection_set_held()). Return 0 or negative errno. */
int connection_reply_part(Connection *c, const void *data, size_t size);
int connection_reply_part_json(Connection *c, const json_t *value);
/* Raw text by reference, not copied (varlink_output_enqueue_shared()): release(userdata) runs once it is sent or
 * dropped; not on failure. */
int connection_reply_part_shared(Connection *c, const void *data, size_t size, void (*release)(void *userdata),
                                 void *userdata);
/* A last reply, as connection_reply() queues it, but -ENOBUFS where it does not fit under the output cap: then
 * nothing is queued and the connection is not closed (Metrics sends it in parts instead). */
int connection_reply_if_room(Connection *c, json_t *parameters);
/* fn runs once, as soon as the unsent output is below mark bytes (at once, if it is); NULL: nothing. */
void connection_when_output_below(Connection *c, size_t mark, void (*fn)(Connection *c));
size_t connection_get_pending_output(const Connection *c);
/* The cap on unsent output (max-output-per-connection= as it was when the connection came). */
size_t connection_get_output_max(const Connection *c);
/* Bytes held by its buffers (input and unsent output), for the owner's accounting of memory freed. */
size_t connection_get_buffered(const Connection *c);

/* Held, no call is taken, not even read for a ProtocolError: a reply in parts is being produced. A client
 * that fills its input meanwhile is closed. Unheld, the calls behind run (connection_resume()). */
void connection_set_held(Connection *c, bool held);
/* Runs the calls that can run now: a deferred one again, and those behind it. */
void connection_resume(Connection *c);

/* What a connection holds, for a handover to the next brokerd (handover.h): its socket (still the
 * connection's) and copies of the input not yet taken as calls (a deferred call first, as text) and of the
 * output not yet sent. */
typedef struct ConnectionState {
        int fd;
        void *input;
        size_t n_input;
        void *output;
        size_t n_output;
} ConnectionState;

/* Returns 0; -EBUSY when it cannot go as bytes (fds wait with a call or a reply, a reply goes out in parts);
 * -ENOTCONN once closed; -ENOMEM. */
int connection_export(Connection *c, ConnectionState *ret);
/* Handed over: closing it now only drops this process's reference, the socket stays as it is for the next
 * brokerd (no shutdown). */
void connection_set_handed_over(Connection *c);
/* A connection taken back: its input and output as they were. The calls in the input run at the next
 * connection_resume(). Returns 0, -ENOBUFS (beyond its limits), -ENOMEM. */
int connection_restore(Connection *c, const void *input, size_t n_input, const void *output, size_t n_output);

/* Reads again from the connections whose uid's fds in the closer fell below its limit (closer.h): when the
 * closer says so (closer_notify_fd()), and after the limits changed. */
void connection_resume_reading(void);
/* Connections not read now, for that reason. */
unsigned connection_paused_count(void);

bool connection_is_closed(const Connection *c);
/* Idempotent; the disconnect handler runs once. The memory stays until connection_free(). */
void connection_close(Connection *c);
