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

Usage: test-passed-fds.py BROKERD [unittest arguments]
"""
import os
import signal
import socket
import struct
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
    SO_LINGER {1, 15 s}: its last close() blocks up to 15 s."""

    def __init__(self):
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
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, LINGER_S))

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
            finally:
                os.kill(b.proc.pid, signal.SIGCONT)
            for s in socks:
                s.sock.close()
            refused.wait_eof(timeout=LINGER_S + 5)
            refused.close()
            start = time.monotonic()
            first.call("io.slotbroker.Status", timeout=LINGER_S + 5)
            elapsed = time.monotonic() - start
            self.assertLess(elapsed, 1.0, f"a client waited {elapsed:.1f} s after a refused connection")


if __name__ == "__main__":
    (_,), argv = harness.arguments(__doc__, 1)
    harness.main(argv)
