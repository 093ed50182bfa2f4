#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tcpproxy.py — a TCP proxy the test controls, to make partitions between a brokerd and its Redis.

The proxy listens on 127.0.0.1 only and forwards each connection it accepts to its target (a TCP address or
a Unix socket: the test's redis-server). Both directions, "up" (client → target) and "down" (target →
client), follow a rule of their own, set from the test at any time:

    pass        bytes are forwarded as they come
    blackhole   nothing is forwarded: the proxy stops reading (drop=False: the bytes wait in the kernel's
                buffers and flow when the blackhole ends, as a partition that heals before TCP gives up)
                or reads and discards them (drop=True: silently lost; a connection that lost bytes cannot
                go on as a stream, so it is reset when the blackhole ends, as TCP would when it gave up).
                New connections are accepted (the kernel completes the handshake anyway) and get the same.
    delay       every chunk is delivered `seconds` after it was read, order kept ("hold traffic N s")

and reset() is an action: every open connection is closed with SO_LINGER 0 (an RST both ways), and for
`refuse_for` seconds new connections are reset at once. A rule given a duration reverts to pass by itself
when it runs out (measured from when the proxy applied it: the call returns once it has).

spare(pid) exempts one process's connections from the rules (they pass, whatever the rules say): a
partition that leaves that process alone with the target. A connection is that process's when its client
socket is: the client's port, looked up in /proc/net/tcp, gives the socket's inode, which one of
/proc/PID/fd links to (looked up when spare() is called, for the connections open then, and at accept).

    p = TcpProxy(redis.address).start()          # p.port, p.address; p.url(db) for a brokerd config
    p.blackhole(5)                               # both ways, 5 s, then pass again
    p.blackhole(direction="down", drop=True)     # until p.passthrough()
    p.delay(5, duration=60)                      # every chunk 5 s late, for 60 s
    p.reset()
    p.spare(brokerd.pid); p.blackhole(drop=True)  # every connection dropped but that brokerd's
    p.close()

One thread running a selectors loop; the test's calls are queued to it and wait until it has applied them,
so what a test does after a call sees the new rule (deterministic, no sleeps). Python 3 standard library only.
"""
import collections
import errno
import os
import queue
import selectors
import socket
import struct
import threading
import time

DIRECTIONS = ("up", "down")
# Bytes read from one side and not yet written to the other, per direction, above which the proxy stops
# reading that side: a slow reader slows the writer, as over a real link.
HIGH_WATER = 1 << 20
CONNECT_TIMEOUT = 2.0
CALL_TIMEOUT = 10.0


class Rule:
    """What a direction does: kind "pass", "blackhole" or "delay"; `until` (monotonic s) or None: for good."""

    def __init__(self, kind="pass", drop=False, latency=0.0, until=None):
        self.kind, self.drop, self.latency, self.until = kind, drop, latency, until

    def reads(self):
        return self.kind != "blackhole" or self.drop

    def __repr__(self):
        extra = " drop" if self.kind == "blackhole" and self.drop else ""
        extra += f" {self.latency:g}s" if self.kind == "delay" else ""
        return f"{self.kind}{extra}"


def _directions(direction):
    if direction == "both":
        return DIRECTIONS
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be 'up', 'down' or 'both', not {direction!r}")
    return (direction,)


PASS = Rule()


def _client_inode(client_port, proxy_port):
    """The inode of the (loopback, IPv4) socket connected from client_port to proxy_port; None if not found."""
    try:
        with open("/proc/net/tcp") as f:
            lines = f.read().split("\n")[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 10:
            continue
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == client_port and int(remote.split(":")[1], 16) == proxy_port:
            return fields[9]
    return None


def _owned_by(pid, inode):
    """Whether process pid has the socket of that inode open."""
    target = f"socket:[{inode}]"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue
    return False


def _reset_close(sock):
    """Closes with an RST (SO_LINGER on, 0 s) instead of a FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class _Conn:
    """One proxied connection: the accepted client socket and the one to the target."""

    def __init__(self, client, upstream):
        self.sock = {"up": client, "down": upstream}          # the side each direction reads from
        self.peer = {"up": upstream, "down": client}          # … and writes to
        self.pending = {d: collections.deque() for d in DIRECTIONS}  # (due, bytes), in order
        self.queued = {d: 0 for d in DIRECTIONS}              # bytes in pending
        self.eof = {d: False for d in DIRECTIONS}             # the reading side sent FIN
        self.shut = {d: False for d in DIRECTIONS}            # … and we passed it on
        self.lost = False                                     # bytes (or a FIN) dropped by a blackhole
        self.closed = False
        self.spared = False                                   # its client is the spared process: rules do not apply

    def sockets(self):
        return (self.sock["up"], self.sock["down"])


class TcpProxy:
    """The proxy (see the module's docstring). target: (host, port) or a Unix socket path."""

    def __init__(self, target, port=0, name="tcpproxy"):
        self.target = target
        self.name = name
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(128)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._calls = queue.Queue()
        self._rules = {d: Rule() for d in DIRECTIONS}
        self._refuse_until = 0.0
        self._spared_pid = None
        self._conns = []
        self._stats = {"accepted": 0, "refused": 0, "resets": 0, "forwarded_up": 0, "forwarded_down": 0,
                       "dropped_up": 0, "dropped_down": 0}
        self._sel = selectors.DefaultSelector()
        self._registered = {}  # socket → events
        self._stopping = False
        self._error = None
        self._thread = None

    # ---- the test's side ----

    @property
    def address(self):
        return ("127.0.0.1", self.port)

    def url(self, db=0):
        """The proxy as a brokerd backend= URL."""
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self):
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def close(self):
        """Stops the loop and closes every socket (the proxied connections with an RST)."""
        if self._thread is None:
            return
        self._stopping = True
        self._wake()
        self._thread.join(CALL_TIMEOUT)
        self._thread = None
        for c in self._conns:
            self._reset_conn(c)
        self._conns.clear()
        self._sel.close()
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()
        if self._error:
            raise RuntimeError(f"{self.name}'s loop failed") from self._error

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def passthrough(self, direction="both"):
        """Forwards again, at once (pending delayed chunks keep their times: a stream keeps its order)."""
        self._call(self._set_rules, direction, lambda: Rule())

    def blackhole(self, seconds=None, direction="both", drop=False):
        """Forwards nothing for `seconds` (None: until passthrough()); see the module's docstring for drop."""
        self._call(self._set_rules, direction, lambda: Rule("blackhole", drop=drop, until=self._until(seconds)))

    def delay(self, seconds, duration=None, direction="both"):
        """Delivers every chunk read from now on `seconds` after it was read, for `duration` s (None: until
        passthrough())."""
        self._call(self._set_rules, direction, lambda: Rule("delay", latency=seconds, until=self._until(duration)))

    def reset(self, refuse_for=0.0):
        """Resets every open connection (RST both ways); new ones are reset on accept for `refuse_for` s.
        Returns how many connections were reset."""
        return self._call(self._reset_all, refuse_for)

    def spare(self, pid):
        """Exempts the connections of process pid from the rules, those open now and those accepted later
        (None: nobody's). Returns how many open connections are spared."""
        return self._call(self._set_spared, pid)

    def rules(self):
        """{"up": "pass", "down": "blackhole"…}: each direction's rule now (timed ones expire by themselves)."""
        return self._call(lambda: {d: repr(r) for d, r in self._rules.items()})

    def passing(self):
        return all(r == "pass" for r in self.rules().values())

    def connections(self):
        """How many proxied connections are open."""
        return self._call(lambda: len(self._conns))

    def stats(self):
        """Counters: accepted, refused (reset on accept), resets (by reset()/a dropped stream),
        forwarded_up/_down and dropped_up/_down (bytes)."""
        return self._call(lambda: dict(self._stats))

    def _call(self, fn, *args):
        """Runs fn(*args) on the loop's thread and returns its value once it has run."""
        if self._error:
            raise RuntimeError(f"{self.name}'s loop failed") from self._error
        if self._thread is None:
            raise RuntimeError(f"{self.name} is not running")
        done = threading.Event()
        box = {}
        self._calls.put((fn, args, box, done))
        self._wake()
        if not done.wait(CALL_TIMEOUT):
            raise RuntimeError(f"{self.name}'s loop did not answer within {CALL_TIMEOUT} s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _wake(self):
        try:
            self._wake_w.send(b"x")
        except BlockingIOError:
            pass  # already awake

    @staticmethod
    def _until(seconds):
        return None if seconds is None else time.monotonic() + seconds

    # ---- the loop's side ----

    def _set_rules(self, direction, make):
        for d in _directions(direction):
            self._end_rule(d)
            self._rules[d] = make()

    def _set_spared(self, pid):
        self._spared_pid = pid
        for c in self._conns:
            c.spared = self._is_spared(c)
        return sum(1 for c in self._conns if c.spared)

    def _is_spared(self, conn):
        if self._spared_pid is None:
            return False
        try:
            client_port = conn.sock["up"].getpeername()[1]
        except OSError:
            return False
        inode = _client_inode(client_port, self.port)
        return inode is not None and _owned_by(self._spared_pid, inode)

    def _rule(self, conn, d):
        return PASS if conn.spared else self._rules[d]

    def _end_rule(self, d):
        """A direction's rule ends: a dropping blackhole leaves its damaged streams reset."""
        r = self._rules[d]
        self._rules[d] = Rule()
        if r.kind == "blackhole" and r.drop:
            for c in [c for c in self._conns if c.lost]:
                self._drop_conn(c, reset=True)

    def _reset_all(self, refuse_for):
        n = len(self._conns)
        for c in list(self._conns):
            self._drop_conn(c, reset=True)
        self._refuse_until = time.monotonic() + refuse_for
        return n

    def _run(self):
        try:
            self._sel.register(self._listener, selectors.EVENT_READ)
            self._sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._stopping:
                self._iterate()
        except BaseException as e:  # kept for the test's next call, which raises it
            self._error = e

    def _iterate(self):
        now = time.monotonic()
        for d in DIRECTIONS:
            if self._rules[d].until is not None and self._rules[d].until <= now:
                self._end_rule(d)
        self._update_interest(now)
        events = self._sel.select(self._timeout(now))
        for key, mask in events:
            sock = key.fileobj
            if sock is self._wake_r:
                self._run_calls()
            elif sock is self._listener:
                self._accept()
            else:
                conn, _ = key.data
                if conn.closed:
                    continue
                if mask & selectors.EVENT_WRITE:
                    self._write(conn, sock)
                if mask & selectors.EVENT_READ and not conn.closed:
                    self._read(conn, sock)

    def _run_calls(self):
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                fn, args, box, done = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                box["value"] = fn(*args)
            except Exception as e:
                box["error"] = e
            done.set()

    def _timeout(self, now):
        """Until the next rule expires or a delayed chunk falls due (None: no such time)."""
        times = [r.until for r in self._rules.values() if r.until is not None]
        for c in self._conns:
            for d in DIRECTIONS:
                if c.pending[d] and c.pending[d][0][0] > now:
                    times.append(c.pending[d][0][0])
        return max(0.0, min(times) - now) if times else None

    def _update_interest(self, now):
        for c in self._conns:
            want = {s: 0 for s in c.sockets()}
            for d in DIRECTIONS:
                if self._rule(c, d).reads() and not c.eof[d] and c.queued[d] < HIGH_WATER:
                    want[c.sock[d]] |= selectors.EVENT_READ
                if c.pending[d] and c.pending[d][0][0] <= now:
                    want[c.peer[d]] |= selectors.EVENT_WRITE
            for s, events in want.items():
                old = self._registered.get(s, 0)
                if events == old:
                    continue
                if events == 0:
                    self._sel.unregister(s)
                    del self._registered[s]
                elif old == 0:
                    self._sel.register(s, events, (c, s))
                else:
                    self._sel.modify(s, events, (c, s))
                if events:
                    self._registered[s] = events

    def _accept(self):
        try:
            client, _ = self._listener.accept()
        except (BlockingIOError, ConnectionAbortedError):
            return
        self._stats["accepted"] += 1
        if time.monotonic() < self._refuse_until:
            self._stats["refused"] += 1
            _reset_close(client)
            return
        if isinstance(self.target, str):
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        else:
            upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        # The target is a local test server: a blocking connect returns at once (or is refused at once).
        upstream.settimeout(CONNECT_TIMEOUT)
        try:
            upstream.connect(self.target)
        except OSError:
            upstream.close()
            self._stats["refused"] += 1
            _reset_close(client)  # the target refused: the client learns it as a reset
            return
        for s in (client, upstream):
            s.setblocking(False)
        if not isinstance(self.target, str):
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(client, upstream)
        conn.spared = self._is_spared(conn)
        self._conns.append(conn)

    def _direction_of(self, conn, sock, reading):
        for d in DIRECTIONS:
            if (conn.sock[d] if reading else conn.peer[d]) is sock:
                return d
        raise AssertionError("socket of no direction")

    def _read(self, conn, sock):
        d = self._direction_of(conn, sock, reading=True)
        rule = self._rule(conn, d)
        try:
            data = sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError as e:
            if e.errno in (errno.ECONNRESET, errno.EPIPE, errno.ETIMEDOUT):
                self._drop_conn(conn, reset=True)  # the RST goes on to the other side
                return
            raise
        if rule.kind == "blackhole":  # a dropping one: reads only to lose it
            self._stats[f"dropped_{d}"] += len(data)
            conn.lost = True
            conn.eof[d] = conn.eof[d] or not data
            return
        if not data:
            conn.eof[d] = True
            self._maybe_shut(conn, d)
            return
        due = time.monotonic() + (rule.latency if rule.kind == "delay" else 0.0)
        conn.pending[d].append((due, data))
        conn.queued[d] += len(data)

    def _write(self, conn, sock):
        d = self._direction_of(conn, sock, reading=False)
        now = time.monotonic()
        q = conn.pending[d]
        while q and q[0][0] <= now:
            due, data = q[0]
            try:
                n = sock.send(data, socket.MSG_NOSIGNAL)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in (errno.ECONNRESET, errno.EPIPE, errno.ETIMEDOUT):
                    self._drop_conn(conn, reset=True)
                    return
                raise
            self._stats[f"forwarded_{d}"] += n
            conn.queued[d] -= n
            if n < len(data):
                q[0] = (due, data[n:])
                return
            q.popleft()
        self._maybe_shut(conn, d)

    def _maybe_shut(self, conn, d):
        """Passes a FIN on once everything before it was written; closes when both ways are done."""
        if not conn.eof[d] or conn.pending[d] or conn.shut[d]:
            return
        conn.shut[d] = True
        try:
            conn.peer[d].shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if all(conn.shut.values()):
            self._drop_conn(conn, reset=False)

    def _drop_conn(self, conn, reset):
        if conn.closed:
            return
        self._reset_conn(conn) if reset else self._close_conn(conn)
        if reset:
            self._stats["resets"] += 1
        self._conns.remove(conn)

    def _forget(self, conn):
        conn.closed = True
        for s in conn.sockets():
            if self._registered.pop(s, None) is not None:
                self._sel.unregister(s)

    def _reset_conn(self, conn):
        self._forget(conn)
        for s in conn.sockets():
            _reset_close(s)

    def _close_conn(self, conn):
        self._forget(conn)
        for s in conn.sockets():
            s.close()
