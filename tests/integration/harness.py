#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""harness.py — shared helpers for the integration tests: a byte-level Varlink client, the real brokerd
on a private socket (self-bound, through systemd-socket-activate, or as systemd's socket unit and fd store
pass it: mode "store", fdstore.py), a stand-in NOTIFY_SOCKET, `slotctl run` as a CI job runs it, polling
helpers, the invariant checker under load (Tracker, monitor: test-brokerd-stress.py, test-restart.py) and
child processes in process groups of their own. Python 3 standard library only.

Run as a program it is a tiny client for tests that need another uid (see client_main()):
    harness.py call SOCKET METHOD [PARAMS_JSON] [--more] [--pid-self] [--hold]
prints every message received as one JSON line, then {"eof": true} if the broker closed the connection.
"""
import ctypes
import fcntl
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.dont_write_bytecode = True  # never leave __pycache__ in the source tree (nor as root, for nobody)

HARNESS = os.path.abspath(__file__)
# The interpreter for clients run as another user: the system's (a python under /root is not theirs to run).
CLIENT_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
DEFAULT_TIMEOUT = 5.0
POLL_INTERVAL = 0.02
NOBODY_UID = 65534
NOGROUP_GID = 65534

# Environment the daemon must not inherit from whoever runs the tests (meson, a systemd unit, a CI).
_SCRUBBED_ENV = ("SLOTBROKER_SOCKET", "RUNTIME_DIRECTORY", "STATE_DIRECTORY", "NOTIFY_SOCKET", "LISTEN_FDS",
                 "LISTEN_PID", "LISTEN_FDNAMES", "WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM",
                 "SYSTEMD_LOG_LEVEL")


def read_text(path):
    with open(path) as f:
        return f.read()


# ---- waiting on conditions ----

def damage_lease_line(state_dir, lease_id):
    """Changes the text of the one lease-log line that names lease_id, its CRC kept: a line that does not check
    out (brokerd(8): such a lease is not known after a restart)."""
    path = os.path.join(state_dir, "leases.log")
    with open(path) as f:
        lines = f.read().splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if '"lease":' in line and lease_id in line]
    assert len(at) == 1, lines
    lines[at[0]] = lines[at[0]].replace(lease_id, lease_id[::-1])
    with open(path, "w") as f:
        f.write("".join(lines))


def children_of(pid):
    """The pids of pid's children (none when it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


class NotThereYet(AssertionError):
    """What a state accessor raises for something not there (a pool not in Status): a failure when asserted
    directly, and "not yet" for wait_for(), whose predicate may run before a reload that makes it."""


def wait_for(predicate, timeout=DEFAULT_TIMEOUT, interval=POLL_INTERVAL, message="condition"):
    """Polls predicate() every `interval` seconds until it returns a truthy value, which is returned.
    Fails (AssertionError) after `timeout` seconds, naming `message` and the last value seen (NotThereYet
    raised by the predicate counts as a false value)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = predicate()
        except NotThereYet as e:
            last = e
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.1f} s waiting for {message} (last value: {last!r})")
        time.sleep(interval)


# ---- timing checks ----

# How late a loaded machine may be: a CI runner shared by many jobs, a sanitizer build, a fresh root on
# a slow disk run timers and deliver wake-ups up to this long after they are due. The upper bound of a
# timing check allows it, so that the check tells "at its time" from "at another, wrong time" (never,
# the lane's budget instead of the client's, the next poll period) without depending on the machine's
# speed. The lower bound stays exact: never early is what the product promises.
LATENESS = 2.0
# The granularity allowed below a due time: the protocol's milliseconds.
EARLINESS = 0.01


def assert_on_time(elapsed, due, what):
    """Fails unless `elapsed` (s, measured from before the test caused the event) is at least `due` (s)
    and at most LATENESS after it."""
    if not due - EARLINESS <= elapsed <= due + LATENESS:
        raise AssertionError(f"{what} after {elapsed:.3f} s: due at {due:.3f} s (at most {LATENESS} s late)")


# ---- the Varlink client ----

class VarlinkError(Exception):
    """An error reply: .error is the qualified name, .parameters its parameters."""

    def __init__(self, error, parameters):
        super().__init__(f"{error} {json.dumps(parameters)}")
        self.error = error
        self.parameters = parameters or {}


class ConnectionClosed(Exception):
    """The broker closed the connection (EOF or reset). .pending: bytes of an unfinished message."""

    def __init__(self, pending=b""):
        super().__init__(f"connection closed by the broker ({len(pending)} bytes of a partial message pending)")
        self.pending = pending


def _wait_fd(sock, events, timeout):
    """poll() one fd (select() cannot watch fds above 1023: the tests open hundreds of sockets)."""
    p = select.poll()
    p.register(sock, events)
    return bool(p.poll(max(0, timeout) * 1000))


class Varlink:
    """One client connection, spoken at the byte level: a message is JSON followed by a NUL byte.
    Every receive has a timeout (select), so a test never hangs on a silent broker."""

    def __init__(self, path, timeout=DEFAULT_TIMEOUT):
        self.path = path
        self.timeout = timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
        except BaseException:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self._buf = bytearray()
        self.eof = False

    def fileno(self):
        return self.sock.fileno()

    def close(self):
        if self.sock.fileno() >= 0:
            self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # sending

    def send_raw(self, data, timeout=None):
        """Sends bytes as they are (any framing, any garbage). Raises BrokenPipeError/ConnectionResetError
        when the broker has closed, TimeoutError when it stops reading for `timeout` seconds."""
        view = memoryview(bytes(data))
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while view:
            try:
                n = self.sock.send(view, socket.MSG_NOSIGNAL)
                view = view[n:]
                continue
            except BlockingIOError:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"broker stopped reading: {len(view)} bytes unsent")
            _wait_fd(self.sock, select.POLLOUT, remaining)

    @staticmethod
    def encode_call(method, parameters=None, more=False, oneway=False, extra=None):
        msg = {"method": method}
        if parameters is not None:
            msg["parameters"] = parameters
        if more:
            msg["more"] = True
        if oneway:
            msg["oneway"] = True
        if extra:
            msg.update(extra)
        return json.dumps(msg, separators=(",", ":")).encode() + b"\0"

    def send(self, method, parameters=None, more=False, oneway=False, extra=None):
        self.send_raw(self.encode_call(method, parameters, more, oneway, extra))

    # receiving

    def _take(self):
        i = self._buf.find(b"\0")
        if i < 0:
            return None
        raw = bytes(self._buf[:i])
        del self._buf[:i + 1]
        try:
            return json.loads(raw)
        except ValueError as e:
            raise AssertionError(f"broker sent a message that is not JSON: {raw[:200]!r}: {e}")

    def _fill(self, timeout):
        """One recv() after waiting at most `timeout` s. Returns False on timeout; raises ConnectionClosed."""
        if self.eof:
            raise ConnectionClosed(bytes(self._buf))
        if not _wait_fd(self.sock, select.POLLIN, timeout):
            return False
        try:
            data = self.sock.recv(1 << 16)
        except BlockingIOError:
            return True
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            raise ConnectionClosed(bytes(self._buf))
        self._buf += data
        return True

    def recv(self, timeout=None):
        """The next whole message (a dict). Raises TimeoutError if none comes within `timeout` seconds,
        ConnectionClosed at EOF."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            msg = self._take()
            if msg is not None:
                return msg
            remaining = deadline - time.monotonic()
            if not self._fill(remaining) and remaining <= 0:
                raise TimeoutError(f"no reply from the broker within {timeout:.1f} s")

    def poll(self, timeout=0.0):
        """The next message if one arrives within `timeout` seconds, else None."""
        try:
            return self.recv(timeout)
        except TimeoutError:
            return None

    def reply(self, timeout=None):
        """The next reply's parameters; raises VarlinkError for an error reply. Returns (parameters, continues)."""
        msg = self.recv(timeout)
        if "error" in msg:
            raise VarlinkError(msg["error"], msg.get("parameters"))
        return msg.get("parameters") or {}, bool(msg.get("continues"))

    def call(self, method, parameters=None, timeout=None, **kw):
        """A simple call: its single reply's parameters, or VarlinkError."""
        self.send(method, parameters, **kw)
        params, continues = self.reply(timeout)
        if continues:
            raise AssertionError(f"{method} without 'more' got a reply with continues")
        return params

    def wait_eof(self, timeout=None):
        """Reads until the broker closes. Returns the messages received before EOF; raises TimeoutError
        if the connection is still open after `timeout` seconds."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        msgs = []
        while True:
            try:
                msg = self._take()
                if msg is not None:
                    msgs.append(msg)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"connection still open after {timeout:.1f} s (received {msgs!r})")
                self._fill(remaining)
            except ConnectionClosed:
                return msgs


def error_of(msg):
    """The error name of a message, or None."""
    return msg.get("error")


# ---- Acquire ----

class Acquisition:
    """An Acquire call and its connection. .msg is the last message received (a dict); .replies all of them."""

    def __init__(self, conn, msg):
        self.conn = conn
        self.msg = msg
        self.replies = [msg]
        self.times = [time.monotonic()]  # when each reply was received (monotonic s)

    @property
    def params(self):
        return self.msg.get("parameters") or {}

    @property
    def error(self):
        return self.msg.get("error")

    @property
    def state(self):
        return None if self.error else self.params.get("state")

    @property
    def granted(self):
        return self.state == "granted"

    @property
    def queued(self):
        return self.state == "queued"

    @property
    def lease(self):
        return self.params.get("lease")

    @property
    def continues(self):
        return bool(self.msg.get("continues"))

    def next(self, timeout=None):
        """Waits for the next message of this call (TimeoutError, ConnectionClosed)."""
        self.msg = self.conn.recv(timeout)
        self.replies.append(self.msg)
        self.times.append(time.monotonic())
        return self.msg

    def until(self, predicate, timeout=DEFAULT_TIMEOUT, what="a reply"):
        """Reads messages until predicate(self) holds; fails after timeout."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out waiting for {what}; last message {self.msg!r}")
            try:
                self.next(remaining)
            except TimeoutError:
                raise AssertionError(f"timed out waiting for {what}; last message {self.msg!r}")
        return self.msg

    def until_granted(self, timeout=DEFAULT_TIMEOUT):
        self.until(lambda a: a.granted or a.error, timeout, "the grant")
        if not self.granted:
            raise AssertionError(f"expected a grant, got {self.msg!r}")
        return self.lease

    def close(self):
        self.conn.close()


def acquire(path, lane, more=True, timeout=DEFAULT_TIMEOUT, oneway=False, **params):
    """Opens a connection, calls io.slotbroker.Acquire(lane, **params) and returns an Acquisition with its
    first reply (which may be a grant, a queued update or an error)."""
    conn = Varlink(path, timeout)
    try:
        p = {"lane": lane}
        p.update(params)
        conn.send("io.slotbroker.Acquire", p, more=more, oneway=oneway)
        msg = conn.recv(timeout)
    except BaseException:
        conn.close()
        raise
    return Acquisition(conn, msg)


# ---- sd_notify stand-in ----

class NotifyListener:
    """A stand-in for systemd's notification socket: AF_UNIX datagram with SO_PASSCRED, every message kept
    with the sender's pid."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind(path)
        os.chmod(path, 0o666)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.messages = []  # (pid, text)
        self.cond = threading.Condition()
        self._stop = False
        self.thread = threading.Thread(target=self._run, name="notify", daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop:
            r, _, _ = select.select([self.sock], [], [], 0.1)
            if not r:
                continue
            try:
                data, anc, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(12))
            except OSError:
                return
            pid = None
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("iII", payload[:12])[0]
            with self.cond:
                self.messages.append((pid, data.decode(errors="replace")))
                self.cond.notify_all()

    def assignments(self):
        """Every VAR=value line received, in order, as (pid, VAR, value)."""
        with self.cond:
            return self._assignments()

    def wait_for(self, predicate, timeout=DEFAULT_TIMEOUT, message="a notification"):
        """Waits until predicate(assignments()) is truthy and returns its value."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                v = predicate(self._assignments())
                if v:
                    return v
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out waiting for {message}; received {self.messages!r}")
                self.cond.wait(remaining)

    def _assignments(self):
        out = []
        for pid, text in self.messages:
            for line in text.split("\n"):
                if "=" in line:
                    k, v = line.split("=", 1)
                    out.append((pid, k, v))
        return out

    def close(self):
        self._stop = True
        self.thread.join(2)
        self.sock.close()


# ---- the daemon ----

def find_brokerd():
    """The brokerd under test: $BROKERD (the scripts set it from their first argument, which meson passes)."""
    path = os.environ.get("BROKERD")
    if not path:
        raise SystemExit("BROKERD is not set: run through meson test, or set BROKERD=/path/to/build/brokerd/brokerd")
    return path


_all_brokers = []


class Broker:
    """The real brokerd on a private socket and state directory under a fresh temporary directory.
    mode "bound": brokerd binds the socket itself (--socket). mode "activate": systemd-socket-activate
    binds it and starts brokerd (execs it in place: same pid) on the first connection, passing the socket
    as fd 3 named "varlink". notify=True adds a stand-in NOTIFY_SOCKET.
    mode "store": as systemd with brokerd.socket and a file descriptor store (fdstore.py): the test holds
    the listening socket across restarts (clients connecting meanwhile wait in its backlog), NOTIFY_SOCKET
    is the store (.store), and each start passes the socket named "varlink" then the stored fds with their
    names (LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID = brokerd's pid), in the order .fd_order says ("arrival",
    "reversed", "shuffled" with .fd_seed). store_max: FileDescriptorStoreMax=. socket_unit=False: a service
    without brokerd.socket, brokerd binds its socket itself and only the stored fds are passed (none: no
    LISTEN_FDS at all). stop() and crash() keep the store for the next start(); cleanup() closes it."""

    def __init__(self, config=None, mode="bound", notify=False, debug=True, brokerd=None, name="brokerd",
                 nofile=None, store_max=8192, socket_unit=True):
        assert mode in ("bound", "activate", "store")
        self.nofile = nofile  # RLIMIT_NOFILE, soft and hard (brokerd raises its soft limit to the hard one)
        self.env = {}  # more environment for brokerd (LD_PRELOAD …), from the next start() on
        self.brokerd = brokerd or find_brokerd()
        self.mode = mode
        self.debug = debug
        self.name = name
        # 0755: clients running as nobody must reach the socket (mode 0666) inside it.
        self.dir = tempfile.mkdtemp(prefix=f"{name}-{mode}-")
        os.chmod(self.dir, 0o755)
        self.socket_path = os.path.join(self.dir, "io.slotbroker")
        self.state_dir = os.path.join(self.dir, "state")
        self.config_path = os.path.join(self.dir, "brokerd.conf")
        self.log_path = os.path.join(self.dir, "brokerd.log")
        self.notify = NotifyListener(os.path.join(self.dir, "notify")) if notify and mode != "store" else None
        self.store = None
        self.listener = None
        self.fd_order = "arrival"
        self.fd_seed = 1  # of the order "shuffled"
        self.passed = []  # names of the fds the last start() passed, in order
        if mode == "store":
            import fdstore
            self.store = fdstore.FdStore(os.path.join(self.dir, "notify"), max_fds=store_max)
        if mode == "store" and socket_unit:
            # brokerd.socket: Backlog=4096 (the kernel caps it at somaxconn), SocketMode=0666 here.
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            self.listener.bind(self.socket_path)
            os.chmod(self.socket_path, 0o666)
            self.listener.listen(4096)
        self.proc = None
        self._log = None
        self.returncode = None
        if config is not None:
            self.write_config(config)
        _all_brokers.append(self)

    # configuration

    def write_config(self, text):
        """Writes the config file atomically (a reload never sees half a file)."""
        tmp = self.config_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.rename(tmp, self.config_path)

    def check_config(self):
        """`brokerd --check-config` of the config file: the finished process (stdout and stderr as text)."""
        return subprocess.run([self.brokerd, "--check-config", "--config", self.config_path],
                              capture_output=True, text=True, timeout=30)

    def argv(self):
        argv = [self.brokerd, "--socket", self.socket_path, "--state-directory", self.state_dir]
        if os.path.exists(self.config_path):
            argv += ["--config", self.config_path]
        return argv

    # lifecycle

    def start(self, timeout=10.0, wait=True):
        """Starts brokerd (or, in mode "activate", the activator) and, if wait, waits until it answers."""
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        if self.debug:
            env["SYSTEMD_LOG_LEVEL"] = "debug"
        env.update(self.env)
        self._log = open(self.log_path, "ab")
        if self.mode == "bound":
            if self.notify:
                env["NOTIFY_SOCKET"] = self.notify.path
            argv = self.argv()
        elif self.mode == "store":
            argv = self.argv()
        else:
            argv = ["systemd-socket-activate", "-l", self.socket_path, "--fdname=varlink"]
            if self.notify:
                argv += ["-E", f"NOTIFY_SOCKET={self.notify.path}"]
            if self.debug:
                argv += ["-E", "SYSTEMD_LOG_LEVEL=debug"]
            argv += self.argv()
        preexec = None
        if self.nofile is not None:
            import resource
            preexec = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))  # noqa: E731
        if self.mode == "store":
            self._start_with_store(argv, env, preexec)
        else:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                         env=env, close_fds=True, preexec_fn=preexec)
        if self.mode == "activate":
            # As a .socket unit's SocketMode=0666 (the activator binds with its own mode): clients of other
            # uids must reach it, and the lanes' ACLs decide. Chmod does not connect: brokerd is not started.
            wait_for(lambda: os.path.exists(self.socket_path) or self.proc.poll() is not None, timeout,
                     message="systemd-socket-activate's socket")
            if self.proc.poll() is None:
                os.chmod(self.socket_path, 0o666)
        if wait:
            self.wait_ready(timeout)
        return self

    def _start_with_store(self, argv, env, preexec):
        """systemd's start of a service with a socket unit and a file descriptor store."""
        import fdstore
        self.store.sync()  # what the last main process sent before it exited
        # Locked from before the fork until the pid is known: READY=1 of the new pid is not taken for a
        # stranger's, and nothing is stored or dropped while the fds are copied.
        with self.store.lock:
            stored = self.store.fds(self.fd_order, self.fd_seed)
            fds = [fd for fd, _ in stored]
            self.passed = [name for _, name in stored]
            if self.listener:
                fds.insert(0, self.listener.fileno())
                self.passed.insert(0, "varlink")
            env = dict(env, NOTIFY_SOCKET=self.store.path)
            if fds:
                env.update(fdstore.listen_env(self.passed))

            def child():
                if preexec:
                    preexec()
                fdstore.renumber_fds(fds)
            self.proc = subprocess.Popen(fdstore.LISTEN_PID_WRAPPER + argv, stdin=subprocess.DEVNULL,
                                         stdout=self._log, stderr=self._log, env=env, close_fds=False,
                                         preexec_fn=child)
            self.store.set_main_pid(self.proc.pid)

    def wait_ready(self, timeout=10.0):
        """Ready = a GetInfo round trip works. Under socket activation the first connection is what starts
        brokerd, so the same poll covers both modes. With a store, READY=1 from brokerd's pid comes first."""
        if self.mode == "store":
            deadline = time.monotonic() + timeout
            pid = self.proc.pid
            try:
                self.store.wait_for(lambda s: s.sent(pid, "READY") or self.proc.poll() is not None, timeout,
                                    f"READY=1 from brokerd (pid {pid})")
            except AssertionError:
                self.dump_log()
                raise
            timeout = max(0.1, deadline - time.monotonic())
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.dump_log()
                raise AssertionError(f"brokerd exited with {self.proc.returncode} before it was ready")
            if os.path.exists(self.socket_path):
                try:
                    with Varlink(self.socket_path, timeout=max(0.1, deadline - time.monotonic())) as c:
                        c.call("org.varlink.service.GetInfo")
                    return
                except (OSError, ConnectionClosed, TimeoutError) as e:
                    last = e
            time.sleep(POLL_INTERVAL)
        self.dump_log()
        raise AssertionError(f"brokerd not ready within {timeout} s: {last!r}")

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=5.0):
        """SIGTERM, then SIGKILL after `timeout` seconds. Returns the exit status (negative: a signal)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.returncode = self.proc.returncode
        if self._log:
            self._log.close()
            self._log = None
        if self.notify:
            self.notify.close()
            self.notify = None
        if self.store:
            self.store.sync()
        return self.returncode

    def crash(self):
        """SIGKILL (a crash: no cleanup of any kind) and reap it; start() runs it again on the same state
        directory and socket."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self._log:
            self._log.close()
            self._log = None
        if self.store:
            self.store.sync()

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def dump_log(self, tail=200):
        lines = self.log().splitlines()
        sys.stderr.write(f"---- {self.name} ({self.mode}) log {self.log_path}, last {min(tail, len(lines))} lines ----\n")
        for line in lines[-tail:]:
            sys.stderr.write(line + "\n")
        sys.stderr.write("---- end of log ----\n")
        sys.stderr.flush()

    def cleanup(self):
        self.stop()
        self.close_store()
        shutil.rmtree(self.dir, ignore_errors=True)

    def close_store(self):
        """Closes the store and the listening socket (mode "store"): what a stopped socket unit does."""
        if self.store:
            self.store.close()
            self.store = None
        if self.listener:
            self.listener.close()
            self.listener = None

    # clients

    def connect(self, timeout=DEFAULT_TIMEOUT):
        return Varlink(self.socket_path, timeout)

    def call(self, method, parameters=None, timeout=DEFAULT_TIMEOUT):
        """One call on a fresh connection; its parameters, or VarlinkError."""
        with self.connect(timeout) as c:
            return c.call(method, parameters, timeout)

    def status(self, timeout=DEFAULT_TIMEOUT):
        return self.call("io.slotbroker.Status", timeout=timeout)

    def pool(self, name, status=None):
        for p in (status or self.status())["pools"]:
            if p["name"] == name:
                return p
        raise NotThereYet(f"pool {name} not in Status")

    def acquire(self, lane, more=True, timeout=DEFAULT_TIMEOUT, **params):
        return acquire(self.socket_path, lane, more=more, timeout=timeout, **params)

    def reload(self):
        return self.call("io.slotbroker.Reload")

    def sighup(self):
        os.kill(self.pid, signal.SIGHUP)

    def fds(self):
        """The daemon's open fds: {fd: link target} ("socket:[INODE]", "anon_inode:[pidfd]", paths…)."""
        out = {}
        base = f"/proc/{self.pid}/fd"
        for name in os.listdir(base):
            try:
                out[int(name)] = os.readlink(f"{base}/{name}")
            except FileNotFoundError:
                pass  # closed while we looked
        return out

    def fd_count(self):
        return len(self.fds())

    def pidfd_count(self):
        return sum(1 for t in self.fds().values() if t == "anon_inode:[pidfd]")

    def client_connections(self):
        """Inodes of the daemon's connected stream sockets: one per client connection it has not closed
        yet (the listening socket and sd_notify's datagram sockets are not counted)."""
        ours = set()
        for target in self.fds().values():
            if target.startswith("socket:["):
                ours.add(int(target[8:-1]))
        connected = set()
        with open("/proc/net/unix") as f:
            next(f)
            for line in f:
                fields = line.split()
                # Num RefCount Protocol Flags Type St Inode [Path]; Type 0001 stream, St 03 connected
                if len(fields) >= 7 and fields[4] == "0001" and fields[5] == "03":
                    connected.add(int(fields[6]))
        return ours & connected

    def tracked(self, open_fn):
        """Runs open_fn() (which must open exactly one connection and complete a round trip on it) and
        returns (its result, the inode of the daemon's end of that connection)."""
        before = self.client_connections()
        result = open_fn()
        new = self.client_connections() - before
        if len(new) != 1:
            raise AssertionError(f"expected one new connection in brokerd, found {len(new)}")
        return result, new.pop()

    def wait_connection_gone(self, inode, timeout=DEFAULT_TIMEOUT):
        """Waits until brokerd has closed its end of a connection: it has processed the client's close."""
        wait_for(lambda: inode not in self.client_connections(), timeout,
                 message=f"brokerd to close connection socket:[{inode}]")

    def responsive(self, timeout=1.0):
        """A GetInfo round trip on a new connection within `timeout` seconds, and the process still runs."""
        if not self.alive():
            raise AssertionError(f"brokerd died (status {self.proc.returncode})")
        with self.connect(timeout) as c:
            info = c.call("org.varlink.service.GetInfo", timeout=timeout)
        if "io.slotbroker" not in info.get("interfaces", []):
            raise AssertionError(f"GetInfo lacks io.slotbroker: {info!r}")
        return True

    def wait_idle(self, pools=None, timeout=DEFAULT_TIMEOUT):
        """Waits until the pools (all by default) have nothing in use and nobody waiting, and Status lists
        no holder and no waiter in them."""
        def idle():
            s = self.status()
            names = pools or [p["name"] for p in s["pools"]]
            busy = [p for p in s["pools"] if p["name"] in names and (p["inUse"] or p["waiting"])]
            holders = [h for h in s["holders"] if h["lease"]["pool"] in names]
            waiters = [w for w in s["waiters"] if w["pool"] in names]
            return (not busy and not holders and not waiters) or None
        try:
            wait_for(idle, timeout, message=f"pools {pools or 'all'} to be idle")
        except AssertionError:
            raise AssertionError(f"pools not idle after {timeout} s: {json.dumps(self.status())}")


class MountNamespaceBroker(Broker):
    """brokerd in a mount namespace of its own (private propagation) where `setup`, sh with $1 the state
    directory, ran first (a tmpfs or a read-only bind mount there, say); the socket, beside the state
    directory, stays reachable. The caller makes the state directory."""

    def __init__(self, config, setup, **kw):
        self.setup = setup
        super().__init__(config, **kw)

    def argv(self):
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", self.setup + ' && shift && exec "$@"',
                "sh", self.state_dir] + super().argv()


def cleanup_all(keep=False):
    """Stops every broker; removes their directories unless keep (then their logs are dumped)."""
    for b in _all_brokers:
        if keep:
            b.stop()
            b.close_store()
            b.dump_log()
            sys.stderr.write(f"(kept {b.dir})\n")
        else:
            b.cleanup()
    _all_brokers.clear()


# ---- the invariant under load (SPEC §3.4, §10) ----

class BrokerTestCase(unittest.TestCase):
    """A test that starts brokerds of its own and holds requests on them, all ended with the test."""

    def broker(self, config, name, clean_exit=True, **kw):
        """brokerd, stopped at the end of the test; clean_exit: it must then exit 0 (under the sanitizers, an
        error or a leak found at exit is a non-zero status)."""
        b = Broker(config, name=name, **kw).start()
        self.addCleanup(self.stop_broker, b, clean_exit)
        return b

    def stop_broker(self, b, clean_exit=True):
        status = b.stop()
        if clean_exit:
            self.assertEqual(status, 0, f"{b.name} exited with status {status}:\n{b.log()[-4000:]}")

    def acquire(self, b, lane, **params):
        a = b.acquire(lane, **params)
        self.addCleanup(a.close)
        return a


class Tracker:
    """What clients saw of one pool of `limit` slots, checked as they see it. A client removes its lease
    from `live` before it does anything that ends it (close, Release), so a grant of a slot still in `live`
    is a double grant. Thread-safe; violations collect in .failures, outcomes in .counts."""

    def __init__(self, limit):
        self.limit = limit
        self.lock = threading.Lock()
        self.live = {}          # slot -> lease id
        self.ids = set()
        self.tokens = set()
        self.failures = []
        self.counts = {}
        self.samples_kept = 0

    def fail(self, text):
        with self.lock:
            if len(self.failures) < 50:
                self.failures.append(text)

    def sample(self, status):
        """A Status sample that showed a violation, printed whole (the first few) with the failures."""
        with self.lock:
            if self.samples_kept < 3:
                self.samples_kept += 1
                self.failures.append("the sample: " + json.dumps(status, sort_keys=True))

    def count(self, what):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def granted(self, lease):
        with self.lock:
            if lease["id"] in self.ids:
                self.failures.append(f"lease id {lease['id']} granted twice")
            self.ids.add(lease["id"])
            if lease["token"] in self.tokens:
                self.failures.append(f"fencing token {lease['token']} granted twice")
            self.tokens.add(lease["token"])
            for slot in lease["slots"]:
                if not 0 <= slot < self.limit:
                    self.failures.append(f"slot {slot} outside 0..{self.limit - 1}: {lease}")
                if slot in self.live:
                    self.failures.append(f"slot {slot} granted to {lease['id']} while lease {self.live[slot]} holds it")
                self.live[slot] = lease["id"]
            self.counts["granted"] = self.counts.get("granted", 0) + 1

    def ending(self, lease):
        with self.lock:
            for slot in lease["slots"]:
                if self.live.get(slot) == lease["id"]:
                    del self.live[slot]


def pool_violations(status, pool, limit):
    """The invariant's checks on one Status sample of one pool: holders ≤ limit, the holders' slots
    distinct and within the limit, inUse = what the holders hold, lease ids unique, waiters' positions 1..n.
    An all-or-nothing lease (also=) is listed once, under its chosen pool, and holds its share of each also=
    pool there; a waiting set likewise, its position the furthest of its places (so positions are checked
    only in a pool no set waits in). Returns (violations as texts, the pool's PoolStatus)."""
    out = []
    [p] = [x for x in status["pools"] if x["name"] == pool]
    slots, ids = [], []
    for h in status["holders"]:
        lease = h["lease"]
        shares = [lease] if lease["pool"] == pool else []
        shares += [a for a in lease.get("also") or [] if a["pool"] == pool]
        for share in shares:
            slots += share["slots"]
        if shares:
            ids.append(lease["id"])
    if p["inUse"] > p["limit"] or p["inUse"] > limit:
        out.append(f"over-subscribed: {p['inUse']} in use of {p['limit']}")
    if len(slots) != len(set(slots)):
        out.append(f"two live leases hold the same slot: {sorted(slots)}")
    if any(not 0 <= x < limit for x in slots):
        out.append(f"slot outside the pool: {slots}")
    if len(slots) != p["inUse"]:
        out.append(f"inUse {p['inUse']} but the holders hold {len(slots)} slots")
    if len(ids) != len(set(ids)):
        out.append(f"a lease id listed twice: {ids}")
    waiters = [w for w in status["waiters"] if w["pool"] == pool or pool in (w.get("also") or [])]
    positions = sorted(w["position"] for w in waiters)
    if not any(w.get("also") for w in waiters) and positions != list(range(1, len(positions) + 1)):
        out.append(f"waiter positions {positions}")
    if p["waiting"] != len(waiters):
        out.append(f"waiting {p['waiting']} but {len(waiters)} waiters listed")
    return out, p


class Restarts:
    """What a test tells monitor() when it crashes and restarts brokerd: begin() before the kill, end() once
    the new one answers. A connection made before a restart may fail; one made after it may not (a thread
    starved while the test restarted brokerd only finds its old connection broken later)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.count = 0
        self.down = False

    def begin(self):
        with self.lock:
            self.count += 1
            self.down = True

    def end(self):
        with self.lock:
            self.down = False

    def expected(self, since):
        """True when a failure of a connection made at restart count `since` is the restart's doing."""
        with self.lock:
            return self.down or self.count != since


def monitor(path, pool, limit, tracker, stop, stats, interval=0.003, restarts=None, on_sample=None,
            timeout=10.0):
    """Samples Status until `stop` (a threading.Event) is set, reporting pool_violations() to the tracker;
    stats gets "samples", "max_in_use" and "max_waiting". restarts: a Restarts the test updates when it
    crashes and restarts brokerd: connection failures it explains are expected, and the monitor
    reconnects. on_sample(status, asked) may add checks of its own (it returns violations as texts); asked
    is when the Status call was sent (time.monotonic()), so that a check knows what had happened before."""
    conn = None
    since = 0
    try:
        while not stop.is_set():
            try:
                if conn is None:
                    since = restarts.count if restarts else 0
                    conn = Varlink(path, timeout)
                asked = time.monotonic()
                s = conn.call("io.slotbroker.Status")
            except (OSError, ConnectionClosed, TimeoutError):
                if conn is not None:
                    conn.close()
                    conn = None
                if restarts is None or not restarts.expected(since):
                    raise
                stop.wait(0.01)
                continue
            stats["samples"] += 1
            violations, p = pool_violations(s, pool, limit)
            if on_sample:
                violations += on_sample(s, asked)
            for v in violations:
                tracker.fail(v)
            if violations:
                # The whole sample, so that a failure in CI can be diagnosed from its log alone.
                tracker.sample(s)
            stats["max_in_use"] = max(stats.get("max_in_use", 0), p["inUse"])
            stats["max_waiting"] = max(stats.get("max_waiting", 0), p["waiting"])
            stop.wait(interval)
    except Exception as e:  # noqa: BLE001 — any failure of the monitor is a test failure
        tracker.fail(f"monitor: {type(e).__name__}: {e}")
    finally:
        if conn is not None:
            conn.close()


# ---- processes ----

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper():
    """Orphans of our children (a command's grandchildren) are reparented to us, so that we can reap them:
    an unreaped zombie keeps its process group's id for ever."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def pid_alive(pid):
    """True while pid runs (a zombie does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def group_alive(pgid):
    """True while process group pgid has a member (a zombie counts: it keeps its group's id; brokerd frees a lease
    whose group has zombies alone)."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def reap(pid=-1):
    """Reaps pid if it has exited; with -1, every child that has exited (as a subreaper, commands whose
    slotctl died are ours); with -PGID, every one of process group PGID (what a killed command left, while
    the statuses of other children stay for whoever waits for them)."""
    while True:
        try:
            got, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if got == 0 or pid > 0:
            return


class Child:
    """A child of the test in a process group of its own, as slotctl runs a command. It runs until its
    stdin closes (finish()), or until killed. With grandchild=True it first starts a grandchild in the same
    group that outlives it (until kill_grandchild())."""

    def __init__(self, grandchild=False, user=None, group=None):
        script = "read x; exit 0" if not grandchild else "sleep 600 </dev/null >/dev/null 2>&1 & echo $!; read x; exit 0"
        kw = {}
        if user is not None:
            kw = {"user": user, "group": group, "extra_groups": []}
        self.proc = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE if grandchild else subprocess.DEVNULL,
                                     process_group=0, close_fds=True, **kw)
        self.pid = self.proc.pid
        self.grandchild = None
        if grandchild:
            line = self.proc.stdout.readline()
            self.grandchild = int(line)

    def finish(self, timeout=DEFAULT_TIMEOUT):
        """Lets the leader exit on its own (status 0) and reaps it."""
        self.proc.stdin.close()
        return self.proc.wait(timeout)

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.kill_grandchild()
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        if self.proc.stdout:
            self.proc.stdout.close()

    def kill_grandchild(self):
        """Kills the grandchild and reaps it (it is ours once the leader has exited: we are a subreaper)."""
        if self.grandchild is None:
            return
        try:
            os.kill(self.grandchild, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(self.grandchild, 0)
        except ChildProcessError:
            pass  # still the leader's child (leader alive): it reaps it
        self.grandchild = None

    def group_alive(self):
        return group_alive(self.pid)


def shared_pool_config(backend, node, ttl):
    """A one-slot pool `shared` kept in `backend` (node TTL `ttl` s, revoke-grace 1 s), node name `node`, with a
    waiting lane `ci` and a fail-fast lane `now`: the shared-pool tests' common configuration."""
    return f"""\
[broker]
node-name = {node}
revoke-grace = 1s

[pool shared]
limit = 1
backend = {backend}
backend-node-ttl = {ttl}s

[lane ci]
pools = shared
policy = wait

[lane now]
pools = shared
policy = fail-fast
"""


class StderrFile:
    """A file for a child's stderr that the test reads while the child writes. Its descriptor is O_APPEND, so
    that the child's writes land at the end whatever the offset they share (Python's mode "a+" does not set
    O_APPEND on a temporary file's descriptor: a write racing a read's seek(0) landed over the first lines);
    read() reads with pread() and moves no offset at all."""

    def __init__(self):
        self._file = tempfile.TemporaryFile()
        fd = self._file.fileno()
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)

    def fileno(self):
        return self._file.fileno()

    def read(self):
        chunks, offset = [], 0
        while chunk := os.pread(self._file.fileno(), 65536, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks).decode(errors="replace")

    def close(self):
        self._file.close()


class SlotctlRun:
    """`slotctl run --socket SOCKET --lane LANE OPTIONS… -- ARGV…` as a CI job runs it: stderr in a file (not a
    terminal). With tty=True its stderr is a pseudo-terminal instead, so that it draws the live position line
    ("\\r\\033[K…waiting for pool P: position N of M, …"); stderr() is then what the terminal received."""

    def __init__(self, slotctl, socket_path, lane, argv, *options, tty=False):
        self.tty = tty
        self._out = bytearray()
        self._lock = threading.Lock()
        if tty:
            import pty
            self._master, slave = pty.openpty()
            os.set_inheritable(self._master, False)
            stderr = slave
            self.err = None
        else:
            self.err = StderrFile()
            stderr = self.err
        try:
            self.proc = subprocess.Popen([slotctl, "run", "--socket", socket_path, "--lane", lane, *options, "--",
                                          *argv], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=stderr)
        finally:
            if tty:
                os.close(slave)
        self.pid = self.proc.pid
        if tty:
            self._reader = threading.Thread(target=self._read_tty, daemon=True)
            self._reader.start()

    def _read_tty(self):
        while True:
            try:
                data = os.read(self._master, 4096)
            except OSError:  # EIO: the last holder of the terminal's other side has gone
                return
            if not data:
                return
            with self._lock:
                self._out += data

    def wait(self, timeout=30):
        return self.proc.wait(timeout)

    def stderr(self):
        if self.tty:
            with self._lock:
                return self._out.decode(errors="replace")
        return self.err.read()

    def kill(self):
        """Kills slotctl and its command's process group (a test's cleanup)."""
        if self.proc.poll() is None:
            for child in children_of(self.proc.pid):
                try:
                    os.killpg(child, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            self.proc.kill()
            self.proc.wait()
        if self.err:
            self.err.close()
        elif self._master >= 0:
            self._reader.join(2)
            os.close(self._master)
            self._master = -1
        reap()


def run_client_as(socket_path, method, parameters=None, uid=NOBODY_UID, gid=NOGROUP_GID, more=False,
                  pid_self=False, timeout=10, extra_groups=()):
    """Runs this file's client as another user (setresuid/setresgid; supplementary groups: extra_groups
    only) and returns the messages it received, plus {"eof": True} if the broker closed the connection."""
    argv = [CLIENT_PYTHON, HARNESS, "call", socket_path, method, json.dumps(parameters or {})]
    if more:
        argv.append("--more")
    if pid_self:
        argv.append("--pid-self")
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, user=uid, group=gid,
                       extra_groups=list(extra_groups), cwd="/", env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    if p.returncode != 0:
        raise AssertionError(f"client as uid {uid} failed ({p.returncode}): {p.stderr}")
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


def spawn_client_as(socket_path, method, parameters=None, uid=NOBODY_UID, gid=NOGROUP_GID, more=True,
                    pid_self=False):
    """Like run_client_as() with --hold: the client keeps its connection (and lease) until its stdin closes.
    Returns the Popen; read its lines with read_json_line()."""
    argv = [CLIENT_PYTHON, HARNESS, "call", socket_path, method, json.dumps(parameters or {}), "--hold"]
    if more:
        argv.append("--more")
    if pid_self:
        argv.append("--pid-self")
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, user=uid, group=gid,
                            extra_groups=[], cwd="/", env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})


def stop_client(proc, timeout=DEFAULT_TIMEOUT):
    """Ends a client from spawn_client_as(): closes its stdin (it exits, closing its connection), waits,
    kills it if it does not go."""
    for f in (proc.stdin,):
        if f and not f.closed:
            try:
                f.close()
            except BrokenPipeError:
                pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout and not proc.stdout.closed:
        proc.stdout.close()
    return proc.returncode


def read_json_line(proc, timeout=DEFAULT_TIMEOUT):
    if not _wait_fd(proc.stdout, select.POLLIN, timeout):
        raise AssertionError(f"client pid {proc.pid} printed nothing within {timeout} s")
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"client pid {proc.pid} exited without output (status {proc.poll()})")
    return json.loads(line)


def client_main(argv):
    """harness.py call SOCKET METHOD [PARAMS_JSON] [--more] [--pid-self] [--hold]"""
    flags = {a for a in argv if a.startswith("--")}
    args = [a for a in argv if not a.startswith("--")]
    if len(args) < 3 or args[0] != "call":
        sys.stderr.write(client_main.__doc__ + "\n")
        return 2
    path, method = args[1], args[2]
    params = json.loads(args[3]) if len(args) > 3 else {}
    if "--pid-self" in flags:
        params["pid"] = os.getpid()
    more = "--more" in flags
    try:
        conn = Varlink(path, 10)
    except OSError as e:
        print(json.dumps({"connectError": e.strerror}), flush=True)
        return 0
    hold = "--hold" in flags
    try:
        conn.send(method, params, more=more)
        while True:
            if hold:
                # Hold the connection until the test closes our stdin, printing whatever arrives meanwhile.
                r, _, _ = select.select([conn, sys.stdin], [], [], 60)
                if sys.stdin in r and not os.read(sys.stdin.fileno(), 1):
                    break
                if conn not in r:
                    continue
                while True:
                    msg = conn.poll(0.0)
                    if msg is None:
                        break
                    print(json.dumps(msg), flush=True)
            else:
                msg = conn.recv(10)
                print(json.dumps(msg), flush=True)
                if "error" in msg or not msg.get("continues") or (msg.get("parameters") or {}).get("state") == "granted":
                    break  # a grant is as far as a one-shot client goes: closing releases it
    except ConnectionClosed:
        print(json.dumps({"eof": True}), flush=True)
        if hold:
            sys.stdin.read()
    except TimeoutError as e:
        print(json.dumps({"timeout": str(e)}), flush=True)
    finally:
        conn.close()
    return 0


# ---- running a test script ----

def arguments(usage, count):
    """The command line of a test run as `test-x.py BROKERD PATH… [unittest arguments]`: exits with `usage`
    unless `count` paths, brokerd's first, are given; puts brokerd's in $BROKERD (find_brokerd()). Returns
    the paths, made absolute, and the argv for main()."""
    if len(sys.argv) <= count:
        sys.exit(usage)
    paths = [os.path.abspath(a) for a in sys.argv[1:count + 1]]
    os.environ["BROKERD"] = paths[0]
    return paths, [sys.argv[0]] + sys.argv[count + 1:]


def main(argv=None):
    """unittest.main() with the harness's bookkeeping: brokers left over are stopped, and their logs are
    printed (and their directories kept) if anything failed or $SLOTBROKER_TEST_KEEP is set. Exits 1 on
    failure, 77 (meson's SKIP) when every test was skipped, else 0."""
    import unittest
    become_subreaper()
    prog = unittest.main(argv=argv, exit=False, verbosity=2)
    result = prog.result
    ok = result.wasSuccessful()
    cleanup_all(keep=not ok or bool(os.environ.get("SLOTBROKER_TEST_KEEP")))
    if ok and result.testsRun and len(result.skipped) == result.testsRun:
        sys.exit(77)  # everything skipped: meson reports SKIP, not OK
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    sys.exit(client_main(sys.argv[1:]))
