#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""fdstore.py — a stand-in for systemd's file descriptor store and notification socket (issue 20), for
tests that restart brokerd without systemd. Python 3 standard library only; imported beside harness.py.

What it does as systemd does (src/core/service.c, service_notify_message() and the fd store):
- An AF_UNIX datagram socket with SO_PASSCRED: $NOTIFY_SOCKET. Messages from a pid other than the main
  one are ignored and their fds closed (Type=notify's NotifyAccess=main); so is a message whose fds were
  cut off (MSG_CTRUNC: more than 768 fds) or longer than 4096 bytes.
- READY=1, STOPPING=1 and every other assignment are kept with the sender's pid (assignments(), wait_for()).
- FDSTORE=1 with FDNAME=NAME (default "stored"; an invalid name counts as none) keeps the fds of the message,
  up to `max_fds` (FileDescriptorStoreMax=; the rest are closed and counted in .overflowed), suppressing an
  fd already stored (the same inode: systemd's same_fd() goes on to kcmp(), but a socket or a memfd cannot
  be opened twice). Fds sent without FDSTORE=1 are closed.
- FDSTOREREMOVE=1 with FDNAME=NAME closes and drops every stored fd of that name.
- A stored fd that reports EPOLLHUP or EPOLLERR (its peer hung up) is closed and dropped, unless FDPOLL=0
  came with it: so a client that goes away while brokerd is down is not passed to the next start.

What it does its own way, for tests: it keeps the fds in arrival order and passes them in the order asked
(fds(order=…): "arrival"; "reversed", what systemd's list gives, newest first; "shuffled", since systemd's
order within one message is a hash set's); the tests can read a stored memfd, replace it with one holding
other bytes (a state cut short, damaged, from another version or boot) or drop entries by name.

    store = FdStore(path, max_fds=8192)
    store.set_main_pid(pid)           # as systemd learns the main pid (harness.Broker does this)
    store.sync()                      # after the main process exited: handle what it sent before dying
    store.names(); store.read("sb-state"); store.replace("sb-state", data)
"""
import fcntl
import json
import os
import random
import select
import socket
import struct
import threading
import time

NOTIFY_BUFFER_MAX = 4096        # systemd's PIPE_BUF-sized buffer; a longer message is ignored
NOTIFY_FD_MAX = 768             # systemd's bound on fds in one notification
FDNAME_MAX = 255


def fdname_is_valid(name):
    """systemd's fdname_is_valid(): 1-255 printable ASCII characters, no ':'."""
    return 0 < len(name) <= FDNAME_MAX and all(32 <= ord(c) < 127 and c != ":" for c in name)


class Stored:
    """One stored fd: .fd (ours), .name, .poll (watched for hang-ups), .inode (fstat st_ino when stored)."""

    def __init__(self, fd, name, poll):
        self.fd = fd
        self.name = name
        self.poll = poll
        st = os.fstat(fd)
        self.inode = st.st_ino
        self.dev = st.st_dev

    def __repr__(self):
        return f"Stored(fd={self.fd}, name={self.name!r}, inode={self.inode})"


class FdStore:
    """systemd's notification socket and fd store for one service; a thread receives and watches."""

    def __init__(self, path, max_fds=8192):
        self.path = path
        self.max_fds = max_fds
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        self.sock.bind(path)
        os.chmod(path, 0o666)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        # Room for a burst of FDSTORE messages while nobody reads (10,000 fds in 253s: 40 datagrams).
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.main_pid = None
        self.messages = []      # (pid, text, number of fds): every message accepted, in order
        self.received = []      # (time.monotonic() when handled, pid, text) of the same messages
        self.ignored = []       # (pid, why): messages dropped as systemd drops them
        self.entries = []       # Stored, in arrival order
        self._by_inode = {}     # (dev, inode) -> Stored: the duplicate check at 10,000 fds
        self.log = []           # ("stored"|"duplicate"|"overflow"|"hup"|"removed"|"closed-extra", name, inode)
        self.overflowed = 0
        self.epoll = select.epoll()
        self.epoll.register(self.sock.fileno(), select.EPOLLIN)
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.epoll.register(self._wake_r, select.EPOLLIN)
        self._stop = False
        self.thread = threading.Thread(target=self._run, name="fdstore", daemon=True)
        self.thread.start()

    # ---- the service's main pid ----

    def set_main_pid(self, pid):
        """Messages are accepted from this pid only (NotifyAccess=main)."""
        with self.lock:
            self.main_pid = pid

    # ---- receiving ----

    def _run(self):
        while not self._stop:
            try:
                events = self.epoll.poll(1.0)
            except OSError:
                return
            with self.lock:
                if self._stop:
                    return
                for fd, ev in events:
                    if fd == self._wake_r:
                        try:
                            os.read(self._wake_r, 4096)
                        except BlockingIOError:
                            pass
                    elif fd == self.sock.fileno():
                        self._receive_all()
                    else:
                        self._hangup(fd)

    def sync(self):
        """Handles every message already sent (those of a main process that has exited included, as systemd
        does before it acts on the SIGCHLD)."""
        with self.lock:
            self._receive_all()

    def _receive_all(self):
        while True:
            try:
                data, anc, flags, _ = self.sock.recvmsg(
                    NOTIFY_BUFFER_MAX + 1,
                    socket.CMSG_SPACE(12) + socket.CMSG_SPACE(NOTIFY_FD_MAX * 4),
                    socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self._message(data, anc, flags)

    def _message(self, data, anc, flags):
        pid = None
        fds = []
        for level, kind, payload in anc:
            if level != socket.SOL_SOCKET:
                continue
            if kind == socket.SCM_CREDENTIALS:
                pid = struct.unpack("iII", payload[:12])[0]
            elif kind == socket.SCM_RIGHTS:
                n = len(payload) // 4
                fds.extend(struct.unpack(f"{n}i", payload[:n * 4]))

        def ignore(why):
            for fd in fds:
                os.close(fd)
            self.ignored.append((pid, why))
            self.cond.notify_all()

        if flags & socket.MSG_CTRUNC:
            return ignore("control data cut short (too many fds)")
        if flags & socket.MSG_TRUNC or len(data) > NOTIFY_BUFFER_MAX:
            return ignore("message too long")
        if pid is None:
            return ignore("no credentials")
        if self.main_pid is not None and pid != self.main_pid:
            return ignore(f"not the main pid {self.main_pid}")
        text = data.decode(errors="replace")
        tags = [line for line in text.split("\n") if line]
        self.messages.append((pid, text, len(fds)))
        self.received.append((time.monotonic(), pid, text))
        names = [t[len("FDNAME="):] for t in tags if t.startswith("FDNAME=")]
        name = names[0] if names else None
        if name is not None and not fdname_is_valid(name):
            name = None
        if "FDSTORE=1" in tags and fds:
            poll = "FDPOLL=0" not in tags
            for fd in fds:
                self._add(fd, name or "stored", poll)
            fds = []
        if "FDSTOREREMOVE=1" in tags and name is not None:
            self._remove(name, "removed")
        for fd in fds:  # fds without FDSTORE=1: systemd closes them
            self.log.append(("closed-extra", name, os.fstat(fd).st_ino))
            os.close(fd)
        self.cond.notify_all()

    def _add(self, fd, name, poll):
        if len(self.entries) >= self.max_fds:
            self.overflowed += 1
            self.log.append(("overflow", name, os.fstat(fd).st_ino))
            os.close(fd)
            return
        st = os.fstat(fd)
        dup = self._by_inode.get((st.st_dev, st.st_ino))
        if dup is not None:
            self.log.append(("duplicate", name, dup.inode))
            os.close(fd)
            return
        e = Stored(fd, name, poll)
        self._by_inode[e.dev, e.inode] = e
        if poll:
            try:
                # Events 0: only EPOLLHUP and EPOLLERR, which epoll always reports.
                self.epoll.register(fd, 0)
            except PermissionError:
                e.poll = False  # not pollable (a regular file): kept, never dropped on its own
        self.entries.append(e)
        self.log.append(("stored", name, e.inode))

    def _close(self, e, why):
        """Closes a stored fd; the caller takes it out of .entries (in one pass, at 10,000 fds)."""
        if e.poll:
            try:
                self.epoll.unregister(e.fd)
            except OSError:
                pass
        os.close(e.fd)
        self._by_inode.pop((e.dev, e.inode), None)
        self.log.append((why, e.name, e.inode))

    def _drop(self, e, why):
        self._close(e, why)
        self.entries.remove(e)

    def _remove(self, name, why):
        keep = []
        for e in self.entries:
            if e.name == name:
                self._close(e, why)
            else:
                keep.append(e)
        self.entries = keep

    def _hangup(self, fd):
        e = next((e for e in self.entries if e.fd == fd), None)
        if e is None:
            return
        # epoll answered before we took the lock: check that it is still so for this fd.
        p = select.poll()
        p.register(fd, 0)
        if any(ev & (select.POLLHUP | select.POLLERR) for _, ev in p.poll(0)):
            self._drop(e, "hup")
            self.cond.notify_all()

    def _wake(self):
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    # ---- what was received ----

    def assignments(self):
        """Every VAR=value line received from an accepted message, in order, as (pid, VAR, value)."""
        with self.lock:
            return self._assignments()

    def _assignments(self):
        out = []
        for pid, text, _ in self.messages:
            for line in text.split("\n"):
                if "=" in line:
                    k, v = line.split("=", 1)
                    out.append((pid, k, v))
        return out

    def wait_for(self, predicate, timeout=10.0, message="a notification"):
        """Waits until predicate(self) is truthy (called with the lock held) and returns its value."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                v = predicate(self)
                if v:
                    return v
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out after {timeout} s waiting for {message}; store {self.names()}, "
                                         f"messages {self.messages[-10:]!r}, ignored {self.ignored[-10:]!r}")
                self.cond.wait(min(remaining, 0.5))

    def sent(self, pid, var, value=None):
        """True once pid sent VAR (=value, if given)."""
        with self.lock:
            return any(p == pid and k == var and (value is None or v == value) for p, k, v in self._assignments())

    def wait_sent(self, pid, var, value="1", timeout=10.0):
        self.wait_for(lambda s: s.sent(pid, var, value), timeout, f"{var}={value} from pid {pid}")

    # ---- the stored fds ----

    def names(self):
        """The names of the stored fds, in arrival order."""
        with self.lock:
            return [e.name for e in self.entries]

    def count(self, name=None):
        with self.lock:
            return sum(1 for e in self.entries if name in (None, e.name))

    def inodes(self, name=None):
        with self.lock:
            return [e.inode for e in self.entries if name in (None, e.name)]

    def fds(self, order="arrival", seed=None):
        """[(fd, name)] of the stored fds (ours: the caller dups them, the store keeps them), in the order to
        pass them: "arrival", "reversed" (systemd's list: newest first) or "shuffled"."""
        with self.lock:
            out = [(e.fd, e.name) for e in self.entries]
        if order == "reversed":
            out.reverse()
        elif order == "shuffled":
            random.Random(seed).shuffle(out)
        elif order != "arrival":
            raise ValueError(order)
        return out

    def _entry(self, name):
        es = [e for e in self.entries if e.name == name]
        if not es:
            raise AssertionError(f"no fd named {name!r} in the store: {[e.name for e in self.entries]}")
        return es[0]

    def read(self, name="sb-state"):
        """The bytes of the first stored fd of that name (a memfd, read from offset 0)."""
        with self.lock:
            fd = self._entry(name).fd
            size = os.fstat(fd).st_size
            return os.pread(fd, size, 0) if size else b""

    def dup(self, name="sb-state"):
        """A dup of the first stored fd of that name (the caller closes it): to look at it after the store
        dropped it, such as the state memfd brokerd must truncate."""
        with self.lock:
            return os.dup(self._entry(name).fd)

    def replace(self, name, data):
        """Replaces the first stored fd of that name by a new memfd holding `data`, in the same place."""
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.write(fd, data)
        with self.lock:
            e = self._entry(name)
            if e.poll:
                try:
                    self.epoll.unregister(e.fd)
                except OSError:
                    pass
            os.close(e.fd)
            self._by_inode.pop((e.dev, e.inode), None)
            e.fd, e.poll = fd, False
            st = os.fstat(fd)
            e.inode, e.dev = st.st_ino, st.st_dev
            self._by_inode[e.dev, e.inode] = e

    def remove(self, name):
        """Drops every fd of that name, as FDSTOREREMOVE=1 does."""
        with self.lock:
            self._remove(name, "removed-by-test")
            self.cond.notify_all()

    def flush(self):
        """Drops every stored fd: the unit stopped (FileDescriptorStorePreserve=no)."""
        with self.lock:
            for e in self.entries:
                self._close(e, "flushed")
            self.entries = []
            self.cond.notify_all()

    def close(self):
        self._stop = True
        self._wake()
        self.thread.join(5)
        with self.lock:
            for e in self.entries:
                self._close(e, "closed")
            self.entries = []
            self.sock.close()
            self.epoll.close()
            os.close(self._wake_r)
            os.close(self._wake_w)


# ---- the state brokerd stores (issue 20's format), for tests that tamper with it ----

def state_cut_short(data):
    """The state cut in the middle (a write that did not finish)."""
    return data[:len(data) // 2]


def state_flipped(data):
    """The middle byte with its top bit flipped: never valid UTF-8, so never valid JSON."""
    b = bytearray(data)
    b[len(b) // 2] ^= 0x80
    return bytes(b)


def state_edited(data, **changes):
    """The JSON state with top-level fields replaced (version=99, boot="…")."""
    obj = json.loads(data)
    obj.update(changes)
    return json.dumps(obj, separators=(",", ":")).encode()


def renumber_fds(fds):
    """For a child about to exec (a preexec_fn, with close_fds=False): puts fds[i] at 3+i, inheritable, and
    closes every other fd above 2, as systemd passes exactly LISTEN_FDS fds. In place, one spare fd at a
    time: a store of 10,000 fds is passed under an RLIMIT_NOFILE of 20,000 (copying them all above the target
    range first would need twice as many)."""
    keep = sorted(fds)
    if len(set(keep)) != len(keep):
        raise ValueError("an fd passed twice")
    low = 3
    for fd in keep:
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 2**31 - 1)  # close_range(2)
    cur = list(fds)
    occupant = {fd: i for i, fd in enumerate(fds)}  # fd number -> the index whose fd sits there
    for i in range(len(fds)):
        t = 3 + i
        if cur[i] == t:
            os.set_inheritable(t, True)
            continue
        j = occupant.pop(t, None)
        if j is not None:
            # Another's fd sits at our target: aside, above the targets done (every one up to t is taken).
            aside = fcntl.fcntl(t, fcntl.F_DUPFD_CLOEXEC, t + 1)
            cur[j] = aside
            occupant[aside] = j
        os.dup2(cur[i], t, inheritable=True)
        os.close(cur[i])
        del occupant[cur[i]]
        occupant[t] = i
        cur[i] = t


def listen_env(names):
    """LISTEN_FDS and LISTEN_FDNAMES for fds named `names` (LISTEN_PID is the wrapper's business)."""
    return {"LISTEN_FDS": str(len(names)), "LISTEN_FDNAMES": ":".join(names)}


# The wrapper that makes LISTEN_PID the pid of the program it execs (sh's own, kept by exec).
LISTEN_PID_WRAPPER = ["sh", "-c", 'LISTEN_PID=$$; export LISTEN_PID; exec "$@"', "sh"]

