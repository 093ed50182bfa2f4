/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "closer.h"
#include "connection.h"
#include "list.h"
#include "log.h"

/* Reads per wakeup: a client that streams without pause cannot hold the loop. */
#define READS_PER_WAKEUP 4

struct Connection {
        Poller *poller;
        int fd;
        PollerWatch watch;         /* the socket, in the poller */
        VarlinkStream stream;
        VarlinkCallMessage next_call; /* taken from the stream, not run yet (deferred by the owner); method NULL: none */
        VarlinkFds next_call_fds;  /* the fds passed with next_call */
        struct ucred cred;
        usec_t peer_since;         /* CLOCK_BOOTTIME at accept: the peer ran by then (connection_get_peer_since()) */
        gid_t *groups;
        size_t n_groups;
        ConnectionCallFn on_call;
        ConnectionInputEndedFn on_input_ended;
        ConnectionDisconnectFn on_disconnect;
        void *userdata;
        bool deferred;             /* next_call was deferred: the owner resumes */
        bool held;                 /* no call is taken: connection_set_held() */
        bool oneway;               /* the call being run wants no reply */
        bool read_eof;             /* the client shut its sending side: answer what it sent, then close */
        size_t output_mark;        /* output_below runs once the unsent output is below this */
        void (*output_below)(Connection *c);
        unsigned dispatching;      /* calls are being run: their replies go out together at the end */
        bool output_deferred;      /* the unsent output is deferred replies only: it waits for company */
        bool handed_over;          /* its socket went to the next brokerd: closed without a shutdown */
        bool paused;               /* not read: its uid's fds wait in the closer (connection_resume_reading()) */
        bool input_full;           /* not read: its input (bytes or fds) is full behind a held reply, until the calls run */
        ListNode paused_node;      /* in paused */
        bool closed;
};

/* Connections of a uid with its limit of fds waiting in the closer, or of anyone when the total is reached
 * (closer.h): nothing more is read from them, since whatever a read brings is in our process at once. Out
 * of the poller altogether: a client's hangup does not close them (their sockets would go to the closer
 * too, and their slots under max-connections-per-uid would be free for the next), nor wake the loop for
 * ever (level-triggered). Their replies wait meanwhile. */
static List paused = { &paused, &paused };
static unsigned n_paused;

static int connection_read_groups(Connection *c) {
        socklen_t size = 64 * sizeof(gid_t);
        for (;;) {
                gid_t *g = malloc(size);
                if (!g)
                        return -ENOMEM;
                socklen_t n = size;
                if (getsockopt(c->fd, SOL_SOCKET, SO_PEERGROUPS, g, &n) >= 0) {
                        /* SO_PEERGROUPS lists the supplementary groups; the primary one counts for allow-groups= too. */
                        size_t k = n / sizeof(gid_t);
                        gid_t *a = reallocarray(g, k + 1, sizeof(gid_t));
                        if (!a) {
                                free(g);
                                return -ENOMEM;
                        }
                        a[k] = c->cred.gid;
                        c->groups = a;
                        c->n_groups = k + 1;
                        return 0;
                }
                free(g);
                if (errno != ERANGE)
                        return negative_errno();
                size = n > size ? n : size * 2; /* the kernel says how much it needs */
        }
}

static int connection_read_groups(Connection *c);

static void connection_update_events(Connection *c) {
        if (c->closed || c->paused)
                return;
        /* After EOF the socket stays readable (level-triggered: for ever); HUP still comes unasked. */
        uint32_t events = c->read_eof || c->input_full ? 0 : EPOLLIN;
        if (varlink_stream_pending_output(&c->stream) > 0 && !c->output_deferred)
                events |= EPOLLOUT;
        (void) poller_set_events(c->poller, &c->watch, events);
}

/* A producer waiting for the output to drain (History's pages) gets its turn. */
static void connection_check_output_below(Connection *c) {
        if (c->closed || !c->output_below || varlink_stream_pending_output(&c->stream) >= c->output_mark)
                return;
        void (*fn)(Connection *c) = c->output_below;
        c->output_below = NULL;
        fn(c);
}

void connection_when_output_below(Connection *c, size_t mark, void (*fn)(Connection *c)) {
        c->output_mark = mark;
        c->output_below = fn;
        connection_check_output_below(c);
}

size_t connection_get_pending_output(const Connection *c) {
        return c->closed ? 0 : varlink_stream_pending_output(&c->stream);
}

size_t connection_get_output_max(const Connection *c) {
        return c->stream.output.max;
}

size_t connection_get_buffered(const Connection *c) {
        /* Also in the disconnect handler: the buffers are freed after it. */
        return c->fd < 0 ? 0 : varlink_stream_pending_output(&c->stream) + c->stream.input.allocated;
}

void connection_set_oneway(Connection *c, bool oneway) {
        c->oneway = oneway;
}

bool connection_get_oneway(const Connection *c) {
        return c->oneway;
}

void connection_bind_call(Connection *c, ConnectionCallFn fn) {
        c->on_call = fn;
}

void connection_bind_input_ended(Connection *c, ConnectionInputEndedFn fn) {
        c->on_input_ended = fn;
}

void connection_bind_disconnect(Connection *c, ConnectionDisconnectFn fn) {
        c->on_disconnect = fn;
}

void connection_set_userdata(Connection *c, void *userdata) {
        c->userdata = userdata;
}

void *connection_get_userdata(const Connection *c) {
        return c->userdata;
}

const struct ucred *connection_get_peer(const Connection *c) {
        return &c->cred;
}

usec_t connection_get_peer_since(const Connection *c) {
        return c->peer_since;
}

void connection_set_peer_since(Connection *c, usec_t since) {
        c->peer_since = MIN(c->peer_since, since);
}

size_t connection_get_groups(const Connection *c, const gid_t **ret) {
        *ret = c->groups;
        return c->n_groups;
}

bool connection_is_closed(const Connection *c) {
        return c->closed;
}

static void connection_flush(Connection *c) {
        if (c->closed || c->output_deferred || varlink_stream_pending_output(&c->stream) == 0)
                return;
        int r = varlink_stream_flush(&c->stream);
        if (r < 0 && r != -EAGAIN) {
                log_debug("Connection of pid %d broke: %s", (int) c->cred.pid, strerror(-r));
                connection_close(c);
                return;
        }
        connection_check_output_below(c);
}

/* A client that lets its unsent output pass the cap is cut (SPEC §10). */
static int connection_check_queued(Connection *c, int r) {
        if (r == -ENOBUFS) {
                log_warning("Client pid %d does not read its replies; closing its connection.", (int) c->cred.pid);
                connection_close(c);
        }
        return r;
}

int connection_reply_part(Connection *c, const void *data, size_t size) {
        if (c->closed)
                return -ENOTCONN;
        return connection_check_queued(c, varlink_output_enqueue(&c->stream.output, data, size));
}

int connection_reply_part_shared(Connection *c, const void *data, size_t size, void (*release)(void *userdata),
                                 void *userdata) {
        if (c->closed)
                return -ENOTCONN;
        return connection_check_queued(c, varlink_output_enqueue_shared(&c->stream.output, data, size, release, userdata));
}

int connection_reply_part_json(Connection *c, const json_t *value) {
        if (c->closed)
                return -ENOTCONN;
        return connection_check_queued(c, varlink_output_enqueue_json_part(&c->stream.output, value));
}

/* After queueing a reply: the cap, else what can go now goes. */
static int connection_queued(Connection *c, int r) {
        r = connection_check_queued(c, r);
        if (r < 0)
                return r;
        c->output_deferred = false; /* deferred replies go with this one */
        if (c->dispatching > 0)
                return 0; /* one send for all the replies of the calls being run: connection_dispatch() */
        connection_flush(c);
        connection_update_events(c);
        return 0;
}

/* Whether a reply may be queued: -ENOTCONN once closed; 0 for a oneway call's, which nobody reads (dropped,
 * not an error); 1 otherwise. */
static int connection_answerable(const Connection *c) {
        if (c->closed)
                return -ENOTCONN;
        return !c->oneway;
}

int connection_reply(Connection *c, json_t *parameters, bool continues) {
        int r = connection_answerable(c);
        if (r <= 0)
                return r;
        return connection_queued(c, varlink_stream_reply(&c->stream, parameters, continues ? VARLINK_REPLY_CONTINUES : 0));
}

int connection_reply_if_room(Connection *c, json_t *parameters) {
        int r = connection_answerable(c);
        if (r <= 0)
                return r;
        r = varlink_stream_reply(&c->stream, parameters, 0);
        if (r == -ENOBUFS)
                return r; /* nothing queued, and the connection stays: its owner sends it otherwise */
        return connection_queued(c, r);
}

int connection_reply_text(Connection *c, const char *parameters, size_t size, bool continues) {
        int r = connection_answerable(c);
        if (r <= 0)
                return r;
        return connection_queued(c, varlink_stream_reply_text(&c->stream, parameters, size,
                                                               continues ? VARLINK_REPLY_CONTINUES : 0));
}

int connection_reply_error(Connection *c, const char *error, json_t *parameters) {
        int r = connection_answerable(c);
        if (r <= 0)
                return r;
        return connection_queued(c, varlink_stream_reply_error(&c->stream, error, parameters));
}

int connection_reply_text_deferred(Connection *c, const char *parameters, size_t size, bool continues) {
        int r = connection_answerable(c);
        if (r <= 0)
                return r;
        /* Output already waiting for the socket is not held back by this one. */
        bool alone = c->output_deferred || varlink_stream_pending_output(&c->stream) == 0;
        r = connection_check_queued(c, varlink_stream_reply_text(&c->stream, parameters, size,
                                                                  continues ? VARLINK_REPLY_CONTINUES : 0));
        if (r < 0)
                return r;
        if (alone)
                c->output_deferred = true;
        return 0;
}

/* Bad input gets a clear answer, then the connection goes: after a message we could not read, the
 * stream's framing cannot be trusted for the next one. */
static void connection_protocol_error(Connection *c, const char *reason) {
        log_debug("Closing connection of pid %d: %s message", (int) c->cred.pid, reason);
        c->oneway = false;
        _cleanup_(json_decrefp) json_t *p = json_pack("{s:s}", "reason", reason);
        (void) connection_reply_error(c, "io.slotbroker.ProtocolError", p);
        connection_close(c);
}

/* Runs the calls that can be answered now. Returns false when the connection had to go. */
static bool connection_run_calls(Connection *c) {
        while (!c->closed) {
                if (c->held)
                        break; /* a reply goes out in parts: nothing comes between them, not even an error */
                if (!c->next_call.method) {
                        /* Read as a call straight away: the envelope is never built as a tree. */
                        int r = varlink_stream_next_call_with_fds(&c->stream, &c->next_call, &c->next_call_fds);
                        if (r == 0)
                                break;
                        if (r < 0) {
                                connection_protocol_error(c, r == -EMSGSIZE ? "too-long" :
                                                             r == -EPROTO   ? "not-a-call" :
                                                                              "malformed");
                                return false;
                        }
                }
                VarlinkCall call = varlink_call_message_call(&c->next_call);
                /* Owns the call's strings. */
                _cleanup_(varlink_call_message_done) VarlinkCallMessage msg = c->next_call;
                c->next_call = VARLINK_CALL_MESSAGE_INIT;
                /* The call's fds are its own: the handler takes what it uses, the rest close with the call. Moved
                 * out first, since the handler may resume the connection and so run the calls behind it. */
                _cleanup_(varlink_fds_close) VarlinkFds fds = c->next_call_fds;
                c->next_call_fds = VARLINK_FDS_INIT;
                call.fds = &fds;
                c->deferred = false;
                if (c->on_call(c, &call, c->userdata) == CONNECTION_CALL_DEFER) {
                        /* Answered, in order, once the owner resumes: kept as it came, fds included. */
                        c->next_call = msg;
                        msg = VARLINK_CALL_MESSAGE_INIT;
                        c->next_call_fds = fds;
                        fds = VARLINK_FDS_INIT;
                        c->deferred = true;
                        break;
                }
        }
        return true;
}

/* A client that shut its sending side (shutdown(SHUT_WR), as `printf … | socat` does) can still read:
 * its calls are answered, in order, and the connection closes once the last reply is out. The owner may
 * know better (an open Acquire ends with its client's input: io.slotbroker(7)). */
static void connection_close_if_finished(Connection *c) {
        if (c->closed || !c->read_eof)
                return;
        if (c->on_input_ended) {
                c->on_input_ended(c, c->userdata);
                if (c->closed)
                        return;
        }
        if (c->held || c->next_call.method)
                return; /* a reply still to come */
        /* What is left in the input is the start of a call that never ended: nobody waits for its answer. */
        if (varlink_stream_pending_output(&c->stream) == 0)
                connection_close(c);
}

static void connection_read_ended(Connection *c) {
        c->read_eof = true;
        connection_close_if_finished(c);
}

void connection_send_deferred(Connection *c) {
        if (c->closed || !c->output_deferred)
                return;
        c->output_deferred = false;
        connection_flush(c);
        connection_close_if_finished(c);
        connection_update_events(c);
}

static void connection_dispatch(Connection *c) {
        /* What the calls leave to close is the client's, whoever resumed it. */
        _cleanup_(closer_owner_restore) _unused_ uid_t owner = closer_set_owner(c->cred.uid);
        /* A Release of the connection's own lease answers twice (the Acquire's end, then the Release),
         * and pipelined calls once each: all of it leaves in one send. */
        c->dispatching++;
        c->input_full = false; /* the calls run: what they leave of the input is read again */
        bool ok = connection_run_calls(c);
        c->dispatching--;
        if (!ok || c->dispatching > 0)
                return;
        connection_flush(c);
        connection_close_if_finished(c);
        connection_update_events(c);
}

void connection_set_held(Connection *c, bool held) {
        c->held = held;
        if (!held)
                connection_resume(c);
}

void connection_resume(Connection *c) {
        if (c->closed)
                return;
        connection_dispatch(c);
}

static void connection_pause(Connection *c) {
        c->paused = true;
        poller_remove(c->poller, &c->watch);
        list_append(&paused, &c->paused_node);
        n_paused++;
}

static void connection_io(PollerWatch *w, uint32_t revents);

/* Back in the poller (taken off the list already): the socket says what it has, a hangup too, at the next
 * batch. */
static void connection_unpause(Connection *c) {
        c->paused = false;
        n_paused--;
        int r = poller_add(c->poller, &c->watch, c->fd, EPOLLIN, connection_io);
        if (r < 0) {
                log_warning_errno(r, "Could not watch the connection of pid %d again, closing it: %m", (int) c->cred.pid);
                connection_close(c);
                return;
        }
        connection_update_events(c);
}

void connection_resume_reading(void) {
        /* Taken from a list of our own, head first: closing one (on failure) may close others. */
        List todo;
        if (list_is_empty(&paused))
                return;
        todo = paused;
        todo.next->prev = todo.prev->next = &todo;
        list_init(&paused);
        ListNode *n;
        while ((n = list_first(&todo))) {
                Connection *c = container_of(n, Connection, paused_node);
                list_unlink(n);
                if (closer_over(c->cred.uid))
                        list_append(&paused, n);
                else
                        connection_unpause(c);
        }
}

unsigned connection_paused_count(void) {
        return n_paused;
}

static void connection_io(PollerWatch *w, uint32_t revents) {
        Connection *c = container_of(w, Connection, watch);
        _cleanup_(closer_owner_restore) _unused_ uid_t owner = closer_set_owner(c->cred.uid);

        if (revents & EPOLLOUT) {
                connection_flush(c);
                connection_close_if_finished(c);
        }
        if (!c->closed && c->read_eof && (revents & (EPOLLHUP | EPOLLERR)))
                connection_close(c); /* it shut the other side too: nobody reads what is left */

        if (!c->closed && !c->read_eof && (revents & (EPOLLIN | EPOLLHUP | EPOLLERR)))
                for (int i = 0; i < READS_PER_WAKEUP && !c->closed; i++) {
                        /* Checked before each read: what it brings is ours to close. */
                        if (closer_over(c->cred.uid)) {
                                connection_pause(c);
                                break;
                        }
                        /* Held with a call's fds unread: the next call's fds would find no room beside them
                         * (ETOOMANYREFS closes the connection). They wait in the socket too. */
                        if (c->held && c->stream.input.fds.n > 0) {
                                c->input_full = true;
                                break;
                        }
                        ssize_t n = varlink_stream_read(&c->stream);
                        if (n == -EAGAIN)
                                break;
                        if (n == -ENOBUFS) {
                                if (c->deferred) {
                                        /* Pipelining a whole buffer behind an open Acquire, which may last
                                         * for ever, is abuse, not use. */
                                        log_debug("Closing connection of pid %d: input full behind an open call",
                                                  (int) c->cred.pid);
                                        connection_close(c);
                                        break;
                                }
                                if (c->held) {
                                        /* A reply on its way (a Status or Metrics waiting for the end of this
                                         * loop iteration, a reply in parts): what is pipelined behind it stays
                                         * in the socket, read once the calls run again. */
                                        c->input_full = true;
                                        break;
                                }
                                connection_dispatch(c);
                                continue;
                        }
                        if (n == 0) {
                                connection_read_ended(c);
                                break;
                        }
                        if (n < 0) {
                                connection_close(c); /* reset: the client is gone */
                                break;
                        }
                        connection_dispatch(c);
                        if (c->stream.drained)
                                break; /* nothing more now; epoll says when there is */
                }

        connection_update_events(c);
}

int connection_new(Poller *poller, int fd, const struct ucred *cred, const ConnectionLimits *limits,
                   Connection **ret) {
        _cleanup_(closer_closep) int fd_owned = fd;

        Connection *c = calloc(1, sizeof(Connection));
        if (!c)
                return -ENOMEM;
        c->poller = poller;
        c->fd = -EBADF;
        c->watch = (PollerWatch) POLLER_WATCH_INIT;

        socklen_t len = sizeof c->cred;
        if (cred)
                c->cred = *cred;
        else if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c->cred, &len) < 0) {
                free(c);
                return negative_errno();
        }
        c->fd = TAKE_FD(fd_owned);
        c->peer_since = now_boottime();
        int r = connection_read_groups(c);
        if (r < 0)
                goto fail;
        varlink_stream_init(&c->stream, c->fd, limits->max_message, limits->max_output);
        /* Acquire's pidfd comes with the call (SCM_RIGHTS): a pid would mean nothing from another PID namespace.
         * What a client passes and brokerd does not keep is closed off the loop (closer.h). */
        varlink_stream_accept_fds(&c->stream, true);
        varlink_set_received_fd_closer(closer_close);
        if (closer_over(c->cred.uid)) {
                /* Accepted (it counts under max-connections-per-uid), not read. */
                connection_pause(c);
                *ret = c;
                return 0;
        }
        r = poller_add(poller, &c->watch, c->fd, EPOLLIN, connection_io);
        if (r < 0) {
                varlink_stream_done(&c->stream);
                goto fail;
        }
        *ret = c;
        return 0;
fail:
        closer_close_as(c->fd, c->cred.uid);
        free(c->groups);
        free(c);
        return r;
}

int connection_export(Connection *c, ConnectionState *ret) {
        if (c->closed)
                return -ENOTCONN;
        if (c->held || c->next_call_fds.n > 0 || c->stream.input.fds.n > 0)
                return -EBUSY;
        _cleanup_free_ char *call = NULL;
        size_t n_call = 0;
        if (c->next_call.method) {
                int r = varlink_call_format(c->next_call.method, c->next_call.parameters, c->next_call.flags, &call,
                                            &n_call);
                if (r < 0)
                        return r;
        }
        const VarlinkInput *in = &c->stream.input;
        size_t n_pending = varlink_input_pending(in);
        _cleanup_free_ char *input = n_call + n_pending > 0 ? malloc(n_call + n_pending) : NULL;
        if (n_call + n_pending > 0 && !input)
                return -ENOMEM;
        if (n_call > 0)
                memcpy(input, call, n_call);
        if (n_pending > 0)
                memcpy(input + n_call, in->data + in->start, n_pending);
        void *output;
        size_t n_output;
        int r = varlink_output_copy(&c->stream.output, &output, &n_output);
        if (r < 0)
                return r;
        *ret = (ConnectionState) {
                .fd = c->fd,
                .input = TAKE_PTR(input),
                .n_input = n_call + n_pending,
                .output = output,
                .n_output = n_output,
        };
        return 0;
}

void connection_set_handed_over(Connection *c) {
        c->handed_over = true;
}

int connection_restore(Connection *c, const void *input, size_t n_input, const void *output, size_t n_output) {
        if (c->closed)
                return -ENOTCONN;
        int r = n_input > 0 ? varlink_input_feed(&c->stream.input, input, n_input) : 0;
        if (r >= 0 && n_output > 0)
                r = varlink_output_enqueue(&c->stream.output, output, n_output);
        if (r < 0)
                return r;
        connection_update_events(c);
        return 0;
}

Connection *connection_free(Connection *c) {
        if (!c)
                return NULL;
        assert(c->closed);
        return mfree(c);
}

void connection_close(Connection *c) {
        if (!c || c->closed)
                return;
        _cleanup_(closer_owner_restore) _unused_ uid_t owner = closer_set_owner(c->cred.uid);
        if (c->paused) {
                c->paused = false;
                list_unlink(&c->paused_node); /* from paused, or from a resume's list */
                n_paused--;
        }
        /* Replies held back for one send (connection_dispatch()) still go, as far as the socket takes them:
         * a ProtocolError, say, before the close it announces. */
        if (c->dispatching > 0 && varlink_stream_pending_output(&c->stream) > 0)
                (void) varlink_stream_flush(&c->stream);
        c->closed = true; /* replies fail from here on */
        c->output_below = NULL;
        poller_remove(c->poller, &c->watch);
        if (c->on_disconnect)
                c->on_disconnect(c, c->userdata);
        varlink_call_message_done(&c->next_call);
        varlink_fds_close(&c->next_call_fds);
        varlink_stream_done(&c->stream);
        /* The socket's unread messages may carry fds: the kernel drops them with the last close(), in the
         * closing thread, and one may be the last reference to a lingering socket. The client sees the end
         * now (shutdown() frees nothing, and nothing can arrive after it); the close comes on the closer's
         * thread unless nothing is queued. A socket handed over stays open in the fd store: not shut down, it
         * may still receive, so the closer has it. */
        if (c->handed_over)
                closer_close_as(TAKE_FD(c->fd), c->cred.uid);
        else {
                (void) shutdown(c->fd, SHUT_RDWR);
                closer_close_socket(TAKE_FD(c->fd), c->cred.uid);
        }
        free(c->groups);
        c->groups = NULL;
}
