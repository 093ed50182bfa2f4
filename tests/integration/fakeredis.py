# SPDX-License-Identifier: MIT
"""A fake Redis for hostile-environment tests (SPEC §11 "Nothing from outside is trusted").

FakeRedis listens on 127.0.0.1 (a free port) and answers brokerd's commands through a behaviour: a
function (fake, conn, args) -> bytes | None | FakeRedis.CLOSE, called for every command, where args are
the command's arguments as bytes. `conn` is a Connection (one per accepted socket): its `send(data)`,
`drip(data, delay)` and `flood(header, total)` write hostile answers; `scripts` maps the SHA of every
SCRIPT LOAD to the script's name (SCRIPT_NAMES' order); brokerd itself loads one library (FUNCTION LOAD)
and calls its functions, "sb_DIGEST_OP", by FCALL: script_of() names the operation of either.

`setup_ok` answers the setup like a real Redis 7.0 (AUTH, SELECT, PING, INFO with the version, a run id,
role master and maxmemory-policy noeviction, FUNCTION LOAD with the library's name, SCRIPT LOAD with the
real SHA-1), so a behaviour that delegates to it first
gets brokerd's link up and then chooses how to answer the scripts and XREAD. `Heartbeats` answers ticks
like the scripts would for a node that holds nothing, so that a pool comes up.

Everything runs on daemon threads; close() stops the listener and every connection.
"""
import hashlib
import re
import socket
import threading
import time

SCRIPT_NAMES = ["submit", "release", "withdraw", "tick", "reclaim", "drain", "positions"]


def bulk(b):
    if b is None:
        return b"$-1\r\n"
    if isinstance(b, str):
        b = b.encode()
    return b"$%d\r\n%s\r\n" % (len(b), b)


def integer(i):
    return b":%d\r\n" % i


def array(*items):
    return b"*%d\r\n" % len(items) + b"".join(items)


def status(s):
    return b"+%s\r\n" % s.encode()


def error(s):
    return b"-%s\r\n" % s.encode()


def encode(v):
    """A Python value as RESP: str/bytes bulk, int integer, list array, None nil."""
    if v is None:
        return bulk(None)
    if isinstance(v, bool):
        return integer(int(v))
    if isinstance(v, int):
        return integer(v)
    if isinstance(v, (str, bytes)):
        return bulk(v)
    return array(*(encode(x) for x in v))


class Connection:
    def __init__(self, fake, sock):
        self.fake = fake
        self.sock = sock
        self.buf = b""
        self.scripts = {}
        self.n_loaded = 0
        self.sent = 0
        self.state = {}
        self.ended = False  # its behaviour returned, or the peer went away

    def send(self, data):
        self.sock.sendall(data)
        self.sent += len(data)

    def drip(self, data, delay):
        for i in range(len(data)):
            if self.fake.closed:
                return
            self.send(data[i:i + 1])
            time.sleep(delay)

    def flood(self, header, total, chunk=1 << 16):
        """Sends header, then zeros up to `total` bytes or until the peer is gone."""
        self.send(header)
        zeros = b"0" * chunk
        while self.sent < total and not self.fake.closed:
            self.send(zeros)

    def _line(self):
        while b"\r\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError
            self.buf += data
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exactly(self, n):
        while len(self.buf) < n + 2:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError
            self.buf += data
        b, self.buf = self.buf[:n], self.buf[n + 2:]
        return b

    def read_command(self):
        line = self._line()
        if not line.startswith(b"*"):
            return line.split()
        args = []
        for _ in range(int(line[1:])):
            n = int(self._line()[1:])
            args.append(self._exactly(n))
        return args


class FakeRedis:
    CLOSE = object()

    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.closed = False
        self.connections = []
        self.commands = []  # (name, args) of every command, in order
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, db=0):
        return f"redis://127.0.0.1:{self.port}/{db}"

    def _accept(self):
        while not self.closed:
            try:
                s, _ = self.sock.accept()
            except OSError:
                return
            c = Connection(self, s)
            with self.lock:
                self.connections.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        try:
            while not self.closed:
                args = c.read_command()
                if not args:
                    continue
                with self.lock:
                    self.commands.append((args[0].upper().decode(errors="replace"), args))
                out = self.behaviour(self, c, args)
                if out is FakeRedis.CLOSE:
                    return
                if out:
                    c.send(out)
        except (OSError, EOFError, ValueError):
            pass
        finally:
            try:
                c.sock.close()
            except OSError:
                pass
            c.ended = True

    def count(self, name):
        with self.lock:
            return sum(1 for n, _ in self.commands if n == name)

    def close(self):
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
        with self.lock:
            for c in self.connections:
                try:
                    c.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


INFO_TEXT = ("# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\nrun_id:%s\r\n"
             "# Replication\r\nrole:master\r\n# Memory\r\nmaxmemory_policy:noeviction\r\n"
             "# Persistence\r\nloading:0\r\n")


def setup_ok(fake, c, args, run_id="f" * 40):
    """Answers the setup commands as a real Redis does; None for anything else."""
    name = args[0].upper()
    if name in (b"AUTH", b"SELECT"):
        return status("OK")
    if name == b"PING":
        return status("PONG")
    if name == b"CLIENT":
        return status("OK")
    if name == b"INFO":
        return bulk(INFO_TEXT % run_id)
    if name == b"FUNCTION" and len(args) > 2 and args[1].upper() == b"LOAD":
        m = re.match(rb"#!lua name=(\w+)", args[-1])
        return bulk(m.group(1)) if m else error("ERR Missing library metadata")
    if name == b"SCRIPT" and len(args) > 2 and args[1].upper() == b"LOAD":
        sha = hashlib.sha1(args[2]).hexdigest()
        c.scripts[sha] = SCRIPT_NAMES[c.n_loaded % len(SCRIPT_NAMES)]
        c.n_loaded += 1
        return bulk(sha)
    return None


def script_of(c, args):
    """The operation an FCALL (or an EVALSHA) calls, and its ARGV (after the key), or (None, None)."""
    if len(args) < 4:
        return None, None
    if args[0].upper() == b"FCALL":
        m = re.fullmatch(r"sb_[0-9a-f]{16}_([a-z]+)", args[1].decode(errors="replace"))
        name = m.group(1) if m and m.group(1) in SCRIPT_NAMES else None
    elif args[0].upper() == b"EVALSHA":
        name = c.scripts.get(args[1].decode())
    else:
        return None, None
    return name, [a.decode(errors="replace") for a in args[4:]]


def cache(stream_last=""):
    return [0, 0, 0, 0, 0, -1, 1, "e1", 0, stream_last, 1]


def reply(status_word, now, body, events=(), cache_value=None, notices=()):
    return encode([status_word, now, body, list(events), cache() if cache_value is None else cache_value,
                   list(notices)])


def tick_ok(now):
    """A tick's answer for a node that holds nothing: rules agreed, fingerprint empty, stream empty."""
    return reply("ok", now, [now + 30_000_000, "e1", 0, "ok", [], [0, 0, 0], "0-0", 1, ""])


def now_us():
    return int(time.monotonic() * 1e6) + 1_000_000_000
