#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""What a client passes on the socket cannot block brokerd (issue 19 j; SPEC §11 "Nothing from outside is
trusted": brokerd never blocks on closing what a client passed).

A client passes, as Acquire's "pidfd", a TCP socket with SO_LINGER {on, 15 s} and data its peer does not
read, and drops its own copy first: brokerd's close() is the last one and would wait the 15 s on the
event loop (no client answered, no heartbeat). The call is refused io.slotbroker... InvalidParameter
("pidfd": not a pidfd), and another client is answered at once. The same socket passed with a call that
takes no fd, and more fds than a message may carry (VARLINK_FDS_MAX = 4), are closed off the loop too.
The fds end closed: brokerd's fd count comes back to where it was. The same sockets queued, unread, in a
connection that brokerd refuses at once (max-connections-per-uid) do not block it either: the kernel drops
them with the connection's last close().

And the fds that wait to be closed are bounded (max-closing-fds-per-uid): one lingering socket holds a
closer's thread for its linger time, and a client that keeps passing fds behind it (4 with each Status) is
not read past its limit, so that brokerd's fd count stays bounded (it grew until accept() failed with
EMFILE: a review's repro). Another user is still answered, at once; the client's calls are answered once
the stuck close ends, and every fd is closed. At max-closing-fds (every user together) nobody is read and
no connection accepted: another user's waits in the backlog, and is answered once the close ends.

Refused connections count against their user's limit first (max-closing-fds-per-uid): one user whose close
blocks, connecting over and over with an fd in each refused connection, filled the total alone, and another
user was neither read nor accepted until the close ended. Past its limit the user's sockets have a budget of
their own: another user is read and accepted; when that budget is full, accepting pauses, bounded.

Usage: test-passed-fds.py BROKERD [unittest arguments]
"""
import json
import os
import signal
import socket
import shutil
import struct
import subprocess
import sys
import time

sys.dont_write_bytecode = True
import harness  # noqa: E402
from harness import Varlink, wait_for  # noqa: E402

CONFIG = """\
[pool local]
limit = 1

[lane local]
pools = local
policy = fail-fast
"""

LINGER_S = 15


class LingeringSocket:
    """A connected TCP socket on loopback whose peer reads nothing, with data queued it cannot send and
    SO_LINGER {1, 15 s}: its last close() blocks up to 15 s, or until the peer is closed."""

    def __init__(self, linger=LINGER_S):
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        self.sock.connect(self.listener.getsockname())
        self.peer, _ = self.listener.accept()  # kept open, never read
        self.sock.setblocking(False)
        queued = 0
        try:
            while True:
                queued += self.sock.send(b"x" * 65536)
        except BlockingIOError:
            pass
        assert queued > 0
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, linger))

    def close(self):
        for s in (self.sock, self.peer, self.listener):
            try:
                s.close()
            except OSError:
                pass


def pass_and_drop(conn, message, fds):
    """Sends message (a call, NUL-terminated) with fds, the fds with all of it but its last byte, then
    closes the sender's copies before brokerd can take the call: its close() is the last one."""
    socket.send_fds(conn.sock, [message[:-1]], [f.fileno() for f in fds])
    for f in fds:
        f.close()
    time.sleep(0.05)  # the fds are in brokerd's input, waiting for the message's end
    conn.send_raw(message[-1:])


NOBODY = 65534


def fork_as(uid, what, child):
    """Runs child() in a child process of another uid (forked: no interpreter to exec that the uid may not
    read); returns a function that waits for what it returned (a JSON value)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.write(w, json.dumps(child()).encode())
            status = 0
        except BaseException as e:  # noqa: B902 - the child reports whatever went wrong
            os.write(w, json.dumps({"child-error": repr(e)}).encode())
        finally:
            os._exit(status)
    os.close(w)

    def finish():
        with os.fdopen(r, "rb") as f:
            out = f.read()
        os.waitpid(pid, 0)
        reply = json.loads(out)
        if "child-error" in reply:
            raise AssertionError(f"{what} as uid {uid}: {reply['child-error']}")
        return reply
    return finish


def start_call_as(b, uid, method, timeout=5.0):
    """One call from another uid; returns a function that waits for its reply."""
    def child():
        with Varlink(b.socket_path, timeout=timeout) as conn:
            conn.send("io.slotbroker." + method)
            return conn.recv(timeout=timeout)
    return fork_as(uid, method, child)


def call_as(b, uid, method, timeout=5.0):
    return start_call_as(b, uid, method, timeout)()


def held_call_as(b, uid, method, timeout=5.0):
    """A connection of another uid, made now, whose one call goes when go() is called; go() returns a
    function that waits for its reply and returns (reply, seconds it took)."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()

    def child():
        os.close(ready_r)
        os.close(go_w)
        with Varlink(b.socket_path, timeout=timeout) as conn:
            os.write(ready_w, b"x")
            os.read(go_r, 1)
            start = time.monotonic()
            conn.send("io.slotbroker." + method)
            reply = conn.recv(timeout=timeout)
            reply["elapsed"] = time.monotonic() - start
            return reply
    finish = fork_as(uid, method + " on a connection it held", child)
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) != b"x":
        finish()  # its error
        raise AssertionError(f"uid {uid} could not connect")
    os.close(ready_r)

    def go():
        os.write(go_w, b"x")
        os.close(go_w)

        def done():
            reply = finish()
            return reply, reply.pop("elapsed")
        return done
    return go


def backlog(path):
    """Connections waiting in the listening socket's backlog, not accepted yet (ss: its Recv-Q)."""
    out = subprocess.run(["ss", "-xlH"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        fields = line.split()
        if path in fields:
            return int(fields[2])
    raise AssertionError(f"no listening socket {path} in ss -xl")


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


class PassedFds(harness.BrokerTestCase):
    def setUp(self):
        self.b = self.broker(CONFIG, "passed-fds")

    def assert_answers_at_once(self, what):
        start = time.monotonic()
        with self.b.connect() as c:
            c.call("io.slotbroker.Status", timeout=LINGER_S + 5)
        elapsed = time.monotonic() - start
        self.assertLess(elapsed, 1.0, f"another client waited {elapsed:.1f} s after {what}")

    def test_lingering_socket_as_a_pidfd(self):
        before = self.b.fd_count()
        s = LingeringSocket()
        self.addCleanup(s.close)
        with self.b.connect() as c:
            pass_and_drop(c, Varlink.encode_call("io.slotbroker.Acquire", {"lane": "local", "pidfd": 0}),
                          [s.sock])
            start = time.monotonic()
            reply = c.recv(timeout=LINGER_S + 5)
            elapsed = time.monotonic() - start
            self.assertEqual(harness.error_of(reply), "org.varlink.service.InvalidParameter", reply)
            self.assertEqual(reply["parameters"].get("parameter"), "pidfd")
            self.assertLess(elapsed, 1.0, f"the refusal took {elapsed:.1f} s")
        self.assert_answers_at_once("a lingering socket passed as a pidfd")
        a = self.acquire(self.b, "local")
        self.assertTrue(a.granted, a.msg)
        a.close()
        # Closed off the loop, within the linger time (the peer is closed now: at once).
        s.close()
        wait_for(lambda: self.b.fd_count() <= before, timeout=LINGER_S + 5, message="the passed socket closed")

    def test_lingering_sockets_with_a_call_that_takes_none(self):
        before = self.b.fd_count()
        socks = [LingeringSocket() for _ in range(6)]  # more than a message may carry
        for s in socks:
            self.addCleanup(s.close)
        with self.b.connect() as c:
            pass_and_drop(c, Varlink.encode_call("io.slotbroker.Status"), [s.sock for s in socks[:4]])
            reply = c.recv(timeout=LINGER_S + 5)
            self.assertIsNone(harness.error_of(reply), reply)
        self.assert_answers_at_once("lingering sockets passed with Status")
        c = self.b.connect()
        try:
            # The lingering ones last: past what a message may carry (4), what brokerd's recvmsg() had no
            # room for the kernel would close in brokerd's thread.
            pass_and_drop(c, Varlink.encode_call("io.slotbroker.Status"),
                          [socket.socket(), socket.socket(), socket.socket(), socks[4].sock, socks[5].sock])
        except OSError:
            pass  # brokerd may close the connection: more fds than a message carries
        c.close()
        self.assert_answers_at_once("more fds than a message may carry")
        for s in socks:
            s.close()
        wait_for(lambda: self.b.fd_count() <= before, timeout=LINGER_S + 5, message="the passed sockets closed")


    def test_lingering_sockets_in_a_refused_connection(self):
        # A connection refused at once (the uid's limit) before brokerd read anything: the fds wait in the
        # socket's queue, and the kernel drops them with brokerd's close() of the socket.
        self.stop_broker(self.b)
        b = self.broker("[broker]\nmax-connections-per-uid = 1\n\n" + CONFIG, "refused-fds")
        socks = [LingeringSocket() for _ in range(2)]
        for s in socks:
            self.addCleanup(s.close)
        with b.connect() as first:
            first.call("io.slotbroker.Status")
            # brokerd stopped while the call and its fds go into the queue: otherwise its refusal may come
            # first and the send fails with EPIPE (seen under ASan in CI), testing nothing.
            os.kill(b.proc.pid, signal.SIGSTOP)
            try:
                refused = Varlink(b.socket_path)
                socket.send_fds(refused.sock, [Varlink.encode_call("io.slotbroker.Status")],
                                [s.sock.fileno() for s in socks])
                # Dropped before brokerd runs again: its close is the last one, not ours (a close here after
                # brokerd's waited the linger, in the test).
                for s in socks:
                    s.sock.close()
            finally:
                os.kill(b.proc.pid, signal.SIGCONT)
            refused.wait_eof(timeout=LINGER_S + 5)
            refused.close()
            start = time.monotonic()
            first.call("io.slotbroker.Status", timeout=LINGER_S + 5)
            elapsed = time.monotonic() - start
            self.assertLess(elapsed, 1.0, f"a client waited {elapsed:.1f} s after a refused connection")

    def stuck_close_then_flood(self, config, name, calls, linger=5, method="io.slotbroker.Status", held=0):
        """brokerd with `config`, one client's lingering socket stuck in a closer's close() (linger s), then up to
        `calls` calls of `method` of that client passing 4 fds each, until brokerd reads no more from it; then
        waits until brokerd holds `held` of their fds (the calls may still be in the socket when the sending ends).
        Returns (brokerd, its fd count before, the lingering socket, the client, the calls sent)."""
        self.stop_broker(self.b)
        b = self.broker(config + CONFIG, name)
        before = b.fd_count()

        def nulls():
            return sum(1 for what in b.fds().values() if what == "/dev/null")
        nulls_before = nulls()
        s = LingeringSocket(linger=linger)
        self.addCleanup(s.close)
        c = b.connect()
        self.addCleanup(c.close)
        pass_and_drop(c, Varlink.encode_call("io.slotbroker.Status"), [s.sock])
        self.assertIsNone(harness.error_of(c.recv(timeout=5)))
        # A closer's thread is in close() now, up to the linger time: whatever else this uid passes waits.
        null = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        self.addCleanup(os.close, null)
        call = Varlink.encode_call(method)
        c.sock.settimeout(2)
        sent = 0
        try:
            for _ in range(calls):
                socket.send_fds(c.sock, [call], [null] * 4)
                sent += 1
        except (socket.timeout, BlockingIOError):
            pass  # brokerd reads no more from us: the socket's buffer is full
        wait_for(lambda: nulls() - nulls_before >= held, timeout=10, message=f"brokerd holding {held} passed fds")
        return b, before, s, c, sent

    def test_fds_behind_a_stuck_close_are_bounded(self):
        if os.getuid() != 0:
            self.skipTest("a client of another uid needs root")
        per_uid = 16
        # A bound on brokerd's fds past its start: the uid's limit, one read's fds past it (4), the fds of a
        # call that waits for its end (4), the connection's socket.
        bound = per_uid + 4 + 4 + 1
        b, before, s, c, sent = self.stuck_close_then_flood(f"[broker]\nmax-closing-fds-per-uid = {per_uid}\n\n",
                                                            "closer-cap", 64)
        self.assertGreater(sent, 2 * bound // 4, "too few calls went for the bound to be tested")

        def paused():
            return metric(call_as(b, NOBODY, "Metrics")["parameters"]["text"],
                          "slotbroker_connections_paused") or 0

        # Either brokerd stopped reading this uid, or its fds grew past the bound (before the fix).
        wait_for(lambda: b.fd_count() > before + bound or paused() >= 1, timeout=10,
                 message="the connection paused or the fds grown")
        grown = b.fd_count() - before
        self.assertLessEqual(grown, bound, f"{grown} fds more in brokerd behind one stuck close")
        # Another user is answered, at once, while this one's calls wait.
        start = time.monotonic()
        self.assertIsNone(harness.error_of(call_as(b, NOBODY, "Status")))
        elapsed = time.monotonic() - start
        self.assertLess(elapsed, 2.0, f"another user waited {elapsed:.1f} s")
        text = call_as(b, NOBODY, "Metrics")["parameters"]["text"]
        self.assertGreaterEqual(metric(text, "slotbroker_closing_fds"), 1, text)
        self.assertLessEqual(b.fd_count() - before, bound)
        # The stuck close ends (its peer goes): the closer says so, and every call is answered.
        s.close()
        for i in range(sent):
            self.assertIsNone(harness.error_of(c.recv(timeout=10)), f"reply {i + 1} of {sent}")
        c.close()
        wait_for(lambda: b.fd_count() <= before, timeout=10, message="every passed fd closed")

    def test_the_total_bounds_every_user(self):
        if os.getuid() != 0:
            self.skipTest("a client of another uid needs root")
        if not shutil.which("ss"):
            self.skipTest("no ss(8) to see the listening socket's backlog")
        total = 8
        bound = total + 4 + 4 + 1  # as above, with the total for the limit
        # The total reached before another user connects (else it is simply served): a call answered at once
        # gives its fds to the closer as it is read, and total - 1 besides the one in close() reach it. (A Status
        # waits for the loop iteration's end, with the fds of the call read behind it.)
        b, before, s, c, sent = self.stuck_close_then_flood(f"[broker]\nmax-closing-fds = {total}\n\n",
                                                            "closer-total", 16, method="org.varlink.service.GetInfo",
                                                            held=total - 1)
        # At the total nobody is read, and no connection accepted: another user's waits in the backlog.
        other = start_call_as(b, NOBODY, "Status", timeout=20)
        wait_for(lambda: b.fd_count() > before + bound or backlog(b.socket_path) >= 1, timeout=10,
                 message="a connection left in the backlog or the fds grown")
        grown = b.fd_count() - before
        self.assertLessEqual(grown, bound, f"{grown} fds more in brokerd behind one stuck close")
        # The stuck close ends: brokerd accepts again, answers the other user and every call.
        s.close()
        self.assertIsNone(harness.error_of(other()))
        for i in range(sent):
            self.assertIsNone(harness.error_of(c.recv(timeout=10)), f"reply {i + 1} of {sent}")
        c.close()
        wait_for(lambda: b.fd_count() <= before, timeout=10, message="every passed fd closed")


    def test_a_reload_that_raises_the_total_accepts_again(self):
        # At the total nothing is accepted; a reload that raises it accepts again at once, not once the stuck
        # close ends (the closer says nothing until then).
        if os.getuid() != 0:
            self.skipTest("a client of another uid needs root")
        if not shutil.which("ss"):
            self.skipTest("no ss(8) to see the listening socket's backlog")
        # As above: the total reached before the other user connects.
        b, before, s, c, sent = self.stuck_close_then_flood("[broker]\nmax-closing-fds = 8\n\n", "closer-reload", 16,
                                                            linger=LINGER_S, method="org.varlink.service.GetInfo",
                                                            held=7)
        other = start_call_as(b, NOBODY, "Status", timeout=LINGER_S + 5)
        wait_for(lambda: backlog(b.socket_path) >= 1, timeout=10, message="a connection left in the backlog")
        b.write_config("[broker]\nmax-closing-fds = 1000\n\n" + CONFIG)
        start = time.monotonic()
        b.sighup()
        self.assertIsNone(harness.error_of(other()))
        elapsed = time.monotonic() - start
        self.assertLess(elapsed, 2.0, f"another user waited {elapsed:.1f} s after the reload")
        s.close()
        for i in range(sent):
            self.assertIsNone(harness.error_of(c.recv(timeout=10)), f"reply {i + 1} of {sent}")
        c.close()
        wait_for(lambda: b.fd_count() <= before, timeout=10, message="every passed fd closed")

    def refused_with_fds(self, b, n, fd, timeout=20.0):
        """n connections of this uid that brokerd refuses at once (max-connections-per-uid), each with a
        Status call and `fd` queued unread in it. Returns them. Sent as soon as connected: brokerd closes a
        refused socket at once when nothing with an fd is queued in it yet, so a send that comes after that
        fails (EPIPE) and is tried again, for up to `timeout` s (an ASan brokerd won 320 of those races in a
        row on a loaded CI machine; 20 a connection were not always enough). brokerd is not stopped
        meanwhile (SIGSTOP): a stop ends the wait of a close that lingers, in brokerd's thread."""
        refused, lost = [], 0
        deadline = time.monotonic() + timeout
        while len(refused) < n and time.monotonic() < deadline:
            r = Varlink(b.socket_path)
            try:
                socket.send_fds(r.sock, [Varlink.encode_call("io.slotbroker.Status")], [fd])
                self.addCleanup(r.close)
                refused.append(r)
            except (BrokenPipeError, ConnectionResetError):
                lost += 1
                r.close()
        self.assertEqual(len(refused), n, f"too few refused connections took their fd ({lost} sends too late)")
        return refused

    def test_refused_connections_do_not_fill_the_total(self):
        # One user whose close blocks, refused over and over (max-connections-per-uid) with an fd queued in
        # each connection: every refused socket waits behind the stuck close, as its user's. Counted in the
        # total, they filled it, and another user was neither read nor accepted until the close ended.
        # Its user's own limit counts them first; past it they have a budget of their own, which pauses
        # accepting when full (bounded), but never another user's reads.
        if os.getuid() != 0:
            self.skipTest("a client of another uid needs root")
        if not shutil.which("ss"):
            self.skipTest("no ss(8) to see the listening socket's backlog")
        per_uid, total = 4, 16
        self.stop_broker(self.b)
        b = self.broker(f"[broker]\nmax-connections-per-uid = 1\nmax-closing-fds-per-uid = {per_uid}\n"
                        f"max-closing-fds = {total}\n\n" + CONFIG, "refused-total")
        before = b.fd_count()
        other = held_call_as(b, NOBODY, "Status", timeout=LINGER_S + 5)
        s = LingeringSocket()
        self.addCleanup(s.close)
        c = b.connect()
        self.addCleanup(c.close)
        pass_and_drop(c, Varlink.encode_call("io.slotbroker.Status"), [s.sock])
        self.assertIsNone(harness.error_of(c.recv(timeout=5)))
        # A closer's thread is in close() now, for this uid: its connection is its one (max-connections-per-uid).
        null = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        self.addCleanup(os.close, null)
        refused = self.refused_with_fds(b, total, null)

        def n_eof():
            n = 0
            for r in refused:
                try:
                    if r.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                        n += 1
                except BlockingIOError:
                    pass
                except ConnectionResetError:
                    n += 1  # closed with its call unread
            return n
        # total - 1 of them, with the stuck close, fill the total: brokerd took that many at least.
        wait_for(lambda: n_eof() >= total - 1, timeout=10, message="the refused connections taken")

        # Another user is read on the connection it has, and accepted on a new one, at once.
        finish = other()
        reply, elapsed = finish()
        self.assertIsNone(harness.error_of(reply), reply)
        self.assertLess(elapsed, 2.0, f"another user's call waited {elapsed:.1f} s on its connection")
        start = time.monotonic()
        self.assertIsNone(harness.error_of(call_as(b, NOBODY, "Status", timeout=LINGER_S + 5)))
        elapsed = time.monotonic() - start
        self.assertLess(elapsed, 2.0, f"another user's new connection waited {elapsed:.1f} s")
        wait_for(lambda: n_eof() == len(refused), timeout=10, message="every refused connection closed")
        text = call_as(b, NOBODY, "Metrics")["parameters"]["text"]
        self.assertEqual(metric(text, "slotbroker_closing_fds"), 1 + total, text)

        # Past its limit the user's refused sockets have a budget of their own (max-closing-fds too): when
        # that is full, nothing is accepted (they wait in the backlog) and brokerd's fds stay bounded.
        more = self.refused_with_fds(b, total, null)
        wait_for(lambda: backlog(b.socket_path) >= 1, timeout=10, message="accepting paused")
        # The log names whose fds they are.
        wait_for(lambda: "of them uid 0's (max-closing-fds)" in b.log(), timeout=5, message="the log naming uid 0")
        grown = b.fd_count() - before
        self.assertLessEqual(grown, 1 + per_uid + total + 1, f"{grown} fds more in brokerd behind one stuck close")
        # The stuck close ends: every refused socket is closed, and the fds with them.
        s.close()
        for r in refused + more:
            r.wait_eof(timeout=LINGER_S + 5)
        c.close()
        wait_for(lambda: b.fd_count() <= before, timeout=10, message="every passed fd closed")


if __name__ == "__main__":
    (_,), argv = harness.arguments(__doc__, 1)
    harness.main(argv)
