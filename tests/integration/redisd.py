#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""redisd.py — real redis-server processes for the tests, and a tiny RESP client to talk to them.

Each RedisServer runs in a directory of its own (its data, log and Unix socket), listens on a Unix socket
and/or a private TCP port on 127.0.0.1, and is stopped by its pid only (never by name). It keeps its
addresses across restarts, so that brokerds configured with them reconnect to the new process.

    require_redis_server()                        # unittest.SkipTest without redis-server
    r = RedisServer(tmpdir).start()               # Unix socket only; port=0: a free TCP port as well
    r.url(db=0)                                   # "unix:///…/redis.sock?db=0" or "redis://127.0.0.1:P/0"
    r.call("SET", "k", "v"); r.info("server")["run_id"]
    r.pause(3000)                                 # CLIENT PAUSE 3000 ALL
    r.sigstop(); r.sigcont()
    r.restart(keep_data=False)                    # a new run id, nothing kept
    r.restart(keep_data=True, kill=True)          # SIGKILL: what the AOF had (appendonly=True) survives
    r.stop()                                      # SIGTERM by pid, SIGKILL after a timeout
    r.env["LD_PRELOAD"] = "…"                     # more environment, from the next (re)start on

Data across a restart: keep_data=False empties the directory; keep_data=True keeps it, and what it holds
is what Redis persisted: the AOF (appendonly=True; up to appendfsync's loss under kill=True), or, without
AOF, an RDB written by SAVE just before a graceful stop (kill=True without AOF loses everything, as a
crashed cache would). The child gets PR_SET_PDEATHSIG SIGKILL: it dies with the thread that started it,
so start servers from the test's main thread (or one that outlives them).

Python 3 standard library only; imported beside harness.py.
"""
import atexit
import ctypes
import itertools
import os
import shutil
import signal
import socket
import subprocess
import time
import unittest

REDIS_SERVER = shutil.which("redis-server")
START_TIMEOUT = 30.0
PR_SET_PDEATHSIG = 1


def require_redis_server():
    """Raises unittest.SkipTest unless redis-server is installed (a test module's whole run is then a
    meson SKIP through harness.main())."""
    if REDIS_SERVER is None:
        raise unittest.SkipTest("redis-server is not installed (Debian: apt-get install redis-server)")
    return REDIS_SERVER


# ---- RESP ----

class RespError(Exception):
    """An error reply: str(e) is Redis's text ("WRONGPASS …", "NOSCRIPT …")."""


def encode_command(*args):
    """A command as a RESP array of bulk strings (str as UTF-8, int/float in decimal, bytes as they are)."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        elif isinstance(a, (int, float)):
            a = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Resp:
    """One connection to a Redis (or anything that claims to be one). address: a Unix socket path or
    (host, port). Bulk strings come back as str (decode=True) or bytes; an error reply is raised as
    RespError at the top level and returned as a RespError value inside an array. Every read has a timeout
    (TimeoutError); the peer closing is ConnectionError."""

    def __init__(self, address, password=None, username=None, db=None, timeout=5.0, decode=True):
        self.address = address
        self.timeout = timeout
        self.decode = decode
        family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.settimeout(timeout)
        self._buf = bytearray()
        try:
            self.sock.connect(address)
            if password is not None:
                self.call(*(["AUTH", username, password] if username else ["AUTH", password]))
            if db is not None:
                self.call("SELECT", db)
        except BaseException:
            self.sock.close()
            raise

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, *args):
        self.sock.sendall(encode_command(*args))

    def read(self, timeout=None):
        """The next reply (see the class's docstring)."""
        self.sock.settimeout(self.timeout if timeout is None else timeout)
        v = self._value()
        if isinstance(v, RespError):
            raise v
        return v

    def call(self, *args, timeout=None):
        self.send(*args)
        return self.read(timeout)

    def _line(self):
        while True:
            i = self._buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self._buf[:i])
                del self._buf[:i + 2]
                return line
            self._fill()

    def _exactly(self, n):
        while len(self._buf) < n + 2:
            self._fill()
        data = bytes(self._buf[:n])
        del self._buf[:n + 2]
        return data

    def _fill(self):
        try:
            data = self.sock.recv(1 << 16)
        except socket.timeout:
            raise TimeoutError(f"no reply from {self.address} within {self.sock.gettimeout()} s") from None
        if not data:
            raise ConnectionError(f"{self.address} closed the connection")
        self._buf += data

    def _value(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RespError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self._exactly(n)
            return data.decode(errors="surrogateescape") if self.decode else data
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._value() for _ in range(n)]
        raise ConnectionError(f"{self.address} does not speak RESP: {line[:80]!r}")


def parse_info(text):
    """INFO's text as a dict (values as strings; "# Section" lines skipped)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and ":" in line:
            k, v = line.split(":", 1)
            out[k] = v
    return out


# ---- the server ----

_all_servers = []
_numbers = itertools.count()
# sockaddr_un's sun_path, with its terminating NUL.
UNIX_PATH_MAX = 108


def _free_tcp_port():
    """A port nobody listens on now (another process may take it before redis-server binds: start() retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class RedisServer:
    """A redis-server of the test's own in a fresh directory under `tmpdir` (see the module's docstring).

    unix: listen on DIR/redis.sock. port: None → no TCP port when unix, else a free one; 0 → a free one;
    N → that one. appendonly/appendfsync: the AOF. policy: maxmemory-policy. password: requirepass.
    config: more `--name value` pairs, a dict."""

    def __init__(self, tmpdir, port=None, unix=True, appendonly=False, appendfsync="everysec",
                 policy="noeviction", password=None, config=None, name="redis"):
        require_redis_server()
        if port is None and not unix:
            port = 0
        self.dir = os.path.join(tmpdir, f"{name}-{next(_numbers)}-{os.getpid()}")
        self.socket_path = os.path.join(self.dir, "redis.sock") if unix else None
        if self.socket_path and len(self.socket_path.encode()) >= UNIX_PATH_MAX:
            raise ValueError(f"{self.socket_path}: too long for a Unix socket (a shorter tmpdir, or unix=False)")
        os.makedirs(self.dir)
        self._want_port = port
        self.port = None if port == 0 else port
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.policy = policy
        self.password = password
        self.config = dict(config or {})
        self.env = {}  # more environment for the process (LD_PRELOAD …), from the next start() on
        self.log_path = os.path.join(self.dir, "redis.log")
        self.proc = None
        self.stopped = False  # SIGSTOPped by sigstop()
        _all_servers.append(self)

    # addresses

    @property
    def address(self):
        """Where a client connects: the Unix socket if there is one, else (127.0.0.1, port)."""
        return self.socket_path or self.tcp_address

    @property
    def tcp_address(self):
        return ("127.0.0.1", self.port) if self.port else None

    def url(self, db=0, tcp=False):
        """The server as a brokerd backend= URL (the Unix socket unless tcp or there is none)."""
        if self.socket_path and not tcp:
            return f"unix://{self.socket_path}?db={db}"
        return f"redis://127.0.0.1:{self.port}/{db}"

    # lifecycle

    def argv(self):
        argv = [REDIS_SERVER, "--port", str(self.port or 0), "--bind", "127.0.0.1", "--dir", self.dir,
                "--logfile", self.log_path, "--daemonize", "no", "--save", "",
                "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", self.appendfsync,
                "--maxmemory-policy", self.policy]
        if self.socket_path:
            argv += ["--unixsocket", self.socket_path, "--unixsocketperm", "700"]
        if self.password is not None:
            argv += ["--requirepass", self.password]
        for k, v in self.config.items():
            argv += [f"--{k}", str(v)]
        return argv

    def start(self, timeout=START_TIMEOUT):
        """Starts redis-server and waits until it answers PING (loading done). A TCP port picked here and
        taken by someone else meanwhile is picked again (a few times)."""
        for attempt in range(5):
            if self._want_port == 0 and self.port is None:
                self.port = _free_tcp_port()
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.STDOUT, close_fds=True, preexec_fn=_die_with_parent,
                                         env=dict(os.environ, **self.env) if self.env else None)
            self.stopped = False
            if self._wait_ready(timeout):
                return self
            if self._want_port == 0 and self.port and "Address already in use" in self.log():
                self.port = None
                continue
            raise AssertionError(f"redis-server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
        raise AssertionError(f"redis-server found no free port:\n{self.log()[-3000:]}")

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if self.call("PING", timeout=1.0) == "PONG":
                    return True
            except (OSError, RespError, TimeoutError) as e:  # not listening yet, or -LOADING
                last = e
            time.sleep(0.02)
        self.kill9()
        raise AssertionError(f"redis-server not ready within {timeout} s ({last!r}):\n{self.log()[-3000:]}")

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=10.0):
        """SIGTERM by pid (a stopped server is continued first), SIGKILL after `timeout` s. Returns the
        exit status."""
        if not self.alive():
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        if self.stopped:
            self.sigcont()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode

    def kill9(self):
        """SIGKILL by pid: a crash (works on a stopped server too)."""
        if self.alive():
            self.proc.kill()
            self.proc.wait()
        self.stopped = False

    def restart(self, keep_data=True, kill=False):
        """Stops the server (SIGTERM; kill: SIGKILL) and starts it again on the same addresses, keeping or
        emptying its data (see the module's docstring). Returns the new run id."""
        if self.alive():
            if keep_data and not kill and not self.appendonly:
                if self.stopped:
                    self.sigcont()
                self.call("SAVE")
            self.kill9() if kill else self.stop()
        if not keep_data:
            for entry in os.listdir(self.dir):
                if entry in ("dump.rdb", "appendonlydir") or entry.startswith("appendonly"):
                    path = os.path.join(self.dir, entry)
                    shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
        self.start()
        return self.run_id()

    def sigstop(self):
        """SIGSTOP by pid: the server stops answering; connections stay open."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.stopped = True

    def sigcont(self):
        os.kill(self.proc.pid, signal.SIGCONT)
        self.stopped = False

    def close(self):
        """Stops the server and removes its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self in _all_servers:
            _all_servers.remove(self)

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    # commands

    def client(self, db=None, timeout=5.0, decode=True):
        """A new connection (authenticated, on `db`); the caller closes it."""
        return Resp(self.address, password=self.password, db=db, timeout=timeout, decode=decode)

    def call(self, *args, db=None, timeout=5.0):
        """One command on a connection of its own."""
        with self.client(db=db, timeout=timeout) as c:
            return c.call(*args)

    def info(self, section=None):
        return parse_info(self.call(*(["INFO", section] if section else ["INFO"])))

    def replication(self):
        """INFO replication, or {} when the connection is cut mid-reply: a Sentinel that reconfigures this
        server ends with CLIENT KILL TYPE normal, which may hit a poll waiting for that very change."""
        try:
            return self.info("replication")
        except ConnectionError:
            return {}

    def run_id(self):
        return self.info("server")["run_id"]

    def pause(self, ms, mode="ALL"):
        """CLIENT PAUSE ms [ALL|WRITE]: Redis holds every client's commands for ms (it stays connected)."""
        return self.call("CLIENT", "PAUSE", ms, mode)

    def unpause(self):
        return self.call("CLIENT", "UNPAUSE")

    def config_set(self, name, value):
        return self.call("CONFIG", "SET", name, value)

    def config_get(self, name):
        reply = self.call("CONFIG", "GET", name)
        return dict(zip(reply[::2], reply[1::2])).get(name)


@atexit.register
def _stop_all():
    """Servers a test left running are stopped by their pids when the interpreter exits."""
    for s in list(_all_servers):
        if s.alive():
            s.kill9()
