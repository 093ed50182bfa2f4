/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "session.h"
#include "audit.h"
#include "connection.h"
#include "history-call.h"
#include "lease.h"
#include "log.h"
#include "manager.h"
#include "methods.h"

/* Reads per wakeup: a client that streams without pause cannot hold the loop. */
#define READS_PER_WAKEUP 4

static int connection_get_groups(Connection *c) {
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

bool connection_is_waiting(const Connection *c) {
        return c->acquire.active && c->acquire.request && engine_request_is_waiting(c->acquire.request);
}

/* An open Acquire, or a lease held by this connection, answers first: later calls wait (SPEC §5). */
static bool connection_busy(const Connection *c) {
        return c->acquire.active || c->lease || c->history_pending;
}

static void connection_update_events(Connection *c) {
        if (c->closed)
                return;
        /* After EOF the socket stays readable (level-triggered: for ever); HUP still comes unasked. */
        uint32_t events = c->read_eof ? 0 : EPOLLIN;
        if (varlink_stream_pending_output(&c->stream) > 0)
                events |= EPOLLOUT;
        (void) poller_set_events(c->manager->poller, &c->watch, events);
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

static void connection_flush(Connection *c) {
        if (c->closed || varlink_stream_pending_output(&c->stream) == 0)
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
        if (c->dispatching > 0)
                return 0; /* one send for all the replies of the calls being run: connection_dispatch() */
        connection_flush(c);
        connection_update_events(c);
        return 0;
}

int connection_reply(Connection *c, json_t *parameters, bool continues) {
        if (c->closed)
                return -ENOTCONN;
        if (c->oneway)
                return 0;
        return connection_queued(c, varlink_stream_reply(&c->stream, parameters, continues ? VARLINK_REPLY_CONTINUES : 0));
}

int connection_reply_error(Connection *c, const char *error, json_t *parameters) {
        if (c->closed)
                return -ENOTCONN;
        if (c->oneway)
                return 0;
        return connection_queued(c, varlink_stream_reply_error(&c->stream, error, parameters));
}

/* Release of the lease this connection holds may overtake the wait for that lease to end: it is what
 * ends it, and the Acquire's last reply still goes out before the Release's, in order. This lets one
 * connection take and give back lease after lease. */
static bool call_releases_own_lease(const Connection *c, const VarlinkCall *call) {
        if (!c->lease || c->acquire.pending || c->history_pending || !streq(call->method, "io.slotbroker.Release"))
                return false;
        json_t *id = json_object_get(call->parameters, "lease");
        return json_is_string(id) && streq(json_string_value(id), c->lease->id);
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
                if (c->history_pending)
                        break; /* its reply goes out in parts: nothing comes between them, not even an error */
                if (!c->next_call) {
                        int r = varlink_stream_next_with_fds(&c->stream, &c->next_call, &c->next_call_fds);
                        if (r == 0)
                                break;
                        if (r < 0) {
                                connection_protocol_error(c, r == -EMSGSIZE ? "too-long" : "malformed");
                                return false;
                        }
                }
                VarlinkCall call;
                if (varlink_call_parse(c->next_call, &call) < 0) {
                        connection_protocol_error(c, "not-a-call");
                        return false;
                }
                if (connection_busy(c) && !call_releases_own_lease(c, &call))
                        break; /* answered, in order, once the open Acquire ends */
                _unused_ _cleanup_(json_decrefp) json_t *msg = TAKE_PTR(c->next_call); /* owns the call's strings */
                /* The call's fds are its own: a method takes what it uses, the rest close with the call. Moved
                 * out first, since a method may end an Acquire and so run the calls behind it. */
                _cleanup_(varlink_fds_close) VarlinkFds fds = c->next_call_fds;
                c->next_call_fds = VARLINK_FDS_INIT;
                call.fds = &fds;
                methods_dispatch(c, &call);
        }
        return true;
}

/* A client that shut its sending side (shutdown(SHUT_WR), as `printf … | socat` does) can still read:
 * its calls are answered, in order, and the connection closes once the last reply is out. An open
 * Acquire is the exception: its connection is the lease's life line, and a client that can send nothing
 * more has ended it, as a hang-up does (io.slotbroker(7)). */
static void connection_close_if_finished(Connection *c) {
        if (c->closed || !c->read_eof)
                return;
        if (c->acquire.active || c->lease) {
                log_debug("Client pid %d shut its side of the connection with an Acquire open; closing.",
                          (int) c->cred.pid);
                connection_close(c);
                return;
        }
        if (connection_busy(c) || c->next_call)
                return; /* a reply still to come */
        /* What is left in the input is the start of a call that never ended: nobody waits for its answer. */
        if (varlink_stream_pending_output(&c->stream) == 0)
                connection_close(c);
}

static void connection_read_ended(Connection *c) {
        c->read_eof = true;
        connection_close_if_finished(c);
}

void connection_dispatch(Connection *c) {
        /* A Release of the connection's own lease answers twice (the Acquire's end, then the Release),
         * and pipelined calls once each: all of it leaves in one send. */
        c->dispatching++;
        bool ok = connection_run_calls(c);
        c->dispatching--;
        if (!ok || c->dispatching > 0)
                return;
        connection_flush(c);
        connection_close_if_finished(c);
        connection_update_events(c);
}

void connection_acquire_done(Connection *c) {
        AcquireCall *a = &c->acquire;
        a->active = false;
        a->request = engine_request_unref(a->request);
        a->command_pidfd = safe_close(a->command_pidfd);
        a->has_command = false;
        a->lane = mfree(a->lane);
        a->job = mfree(a->job);
        connection_dispatch(c);
}

static void connection_io(PollerWatch *w, uint32_t revents) {
        Connection *c = container_of(w, Connection, watch);
        Manager *m = c->manager;

        if (revents & EPOLLOUT) {
                connection_flush(c);
                connection_close_if_finished(c);
        }
        if (!c->closed && c->read_eof && (revents & (EPOLLHUP | EPOLLERR)))
                connection_close(c); /* it shut the other side too: nobody reads what is left */

        if (!c->closed && !c->read_eof && (revents & (EPOLLIN | EPOLLHUP | EPOLLERR)))
                for (int i = 0; i < READS_PER_WAKEUP && !c->closed; i++) {
                        ssize_t n = varlink_stream_read(&c->stream);
                        if (n == -EAGAIN)
                                break;
                        if (n == -ENOBUFS) {
                                if (connection_busy(c)) {
                                        /* Pipelining a whole buffer behind an open Acquire is abuse, not use. */
                                        log_debug("Closing connection of pid %d: input full behind an Acquire",
                                                  (int) c->cred.pid);
                                        connection_close(c);
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
        manager_sync(m);
}

int connection_new(Manager *m, int fd, Connection **ret) {
        _cleanup_close_ int fd_owned = fd;
        const BrokerConfig *cfg = m->config;

        Connection *c = calloc(1, sizeof(Connection));
        if (!c)
                return -ENOMEM;
        c->manager = m;
        c->fd = -EBADF;
        c->watch = (PollerWatch) POLLER_WATCH_INIT;
        c->acquire.command_pidfd = -EBADF;

        socklen_t len = sizeof c->cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c->cred, &len) < 0) {
                free(c);
                return negative_errno();
        }
        c->fd = TAKE_FD(fd_owned);
        int r = connection_get_groups(c);
        if (r < 0)
                goto fail;
        varlink_stream_init(&c->stream, c->fd, cfg->max_message_size, cfg->max_output_per_connection);
        /* Acquire's pidfd comes with the call (SCM_RIGHTS): a pid would mean nothing from another PID namespace. */
        varlink_stream_accept_fds(&c->stream, true);
        r = poller_add(m->poller, &c->watch, c->fd, EPOLLIN, connection_io);
        if (r < 0) {
                varlink_stream_done(&c->stream);
                goto fail;
        }
        list_append(&m->connections, &c->node);
        m->n_connections++;
        manager_uid_usage(m, c->cred.uid, true)->connections++;
        *ret = c;
        return 0;
fail:
        safe_close(c->fd);
        free(c->groups);
        free(c);
        return r;
}

void connection_free(Connection *c) {
        if (!c)
                return;
        assert(c->closed);
        free(c->acquire.lane);
        free(c->acquire.job);
        free(c);
}

void connection_close(Connection *c) {
        if (!c || c->closed)
                return;
        Manager *m = c->manager;
        /* Replies held back for one send (connection_dispatch()) still go, as far as the socket takes them:
         * a ProtocolError, say, before the close it announces. */
        if (c->dispatching > 0 && varlink_stream_pending_output(&c->stream) > 0)
                (void) varlink_stream_flush(&c->stream);
        c->closed = true;
        history_call_abandon(c);

        AcquireCall *a = &c->acquire;
        (void) session_waiter_withdraw(c, SESSION_WITHDRAW_GONE);
        a->request = engine_request_unref(a->request);
        a->command_pidfd = safe_close(a->command_pidfd);
        a->active = false; /* lane and job stay for the audit of decisions still on their way */
        if (a->pending) {
                a->pending->requester = NULL; /* its row still gets written; nobody hears the grant */
                a->pending = NULL;
        }

        if (c->lease)
                lease_holder_gone(c->lease); /* clears c->lease */

        poller_remove(m->poller, &c->watch);
        json_decref(c->next_call);
        c->next_call = NULL;
        varlink_fds_close(&c->next_call_fds);
        manager_memory_freed(m, varlink_stream_pending_output(&c->stream) + c->stream.input.allocated);
        varlink_stream_done(&c->stream);
        c->fd = safe_close(c->fd);
        manager_fd_released(m);
        free(c->groups);
        c->groups = NULL;

        list_unlink(&c->node);
        m->n_connections--;
        UidUsage *u = manager_uid_usage(m, c->cred.uid, false);
        if (u && u->connections > 0)
                u->connections--;
        manager_status_changed(m);

        /* Callers up the stack may still hold c: it is freed once this loop iteration is over. */
        list_append(&m->closed_connections, &c->node);
        (void) sd_event_source_set_enabled(m->gc_source, SD_EVENT_ONESHOT);
}
