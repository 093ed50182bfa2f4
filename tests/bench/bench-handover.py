#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-handover.py — a restart of brokerd through systemd's file descriptor store with 10,000 waiters
(issue 20 item 7): the time from SIGTERM to the first grant after the new start, beside a plain start's, and
brokerd's RSS before the stop and after taking the connections back. Targets: ≤ 1 s, RSS within 10 %.

tests/integration/fdstore.py stands in for systemd (harness.Broker mode "store"): the listening socket is
the test's and stays open across the restart, the store receives the state and the connections, and the
next brokerd gets them as LISTEN_FDS. A one-slot pool is held by one client and WAITERS clients wait on it
(each its own connection, Acquire with "more"). The first grant after the restart is measured honestly: a
Release of the held lease is sent on a new connection once brokerd has said STOPPING=1 (it accepts nothing
more), so it waits in the socket's backlog; the new brokerd takes its 10,000 connections back before it
accepts anyone, then answers the Release and grants the head of the queue, whose client reads the grant:
that read ends the measure. Its parts are printed: the stop (SIGTERM to exit, the handover included), the
stand-in's spawn (copying the fds), the start (spawn to READY=1), and READY=1 to the grant.

The plain start is brokerd started with no stored fds on the same state directory (SIGTERM with no
client, the store flushed, as after `systemctl stop` + `start`): SIGTERM to the first grant of a fresh
Acquire sent once brokerd said STOPPING=1, and spawn to READY=1.

The waiters' connections are held by a child process (this script with --clients), the store's copies by
this one, brokerd's by brokerd: each needs an RLIMIT_NOFILE a little above WAITERS (this machine's hard limit
is 20,000, and root lacks CAP_SYS_RESOURCE here).

Usage: bench-handover.py BROKERD [WAITERS [ROUNDS]]   (defaults 10,000 and 2). Build with
--buildtype=release for figures.
A benchmark, not a test: it fails only when something under it fails.
"""
import json
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402
from harness import Broker, Varlink  # noqa: E402

ACQUIRE = Varlink.encode_call("io.slotbroker.Acquire", {"lane": "L"}, more=True)


def config(waiters):
    room = waiters + 1000
    return f"""\
[broker]
max-connections = {room}
max-connections-per-uid = {room}
max-waiters-per-uid = {room}
reclaim-grace = 60s

[pool p]
limit = 1

[lane L]
pools = p
policy = wait
"""


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid):
    """user + system CPU time of a running process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= n:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(n, soft), max(n, hard)))
    except (ValueError, PermissionError):
        sys.exit(f"bench-handover: RLIMIT_NOFILE {soft}/{hard} is too low for this many waiters (need {n})")


def read_message(sock, buf, timeout):
    """One NUL-terminated message from a blocking-with-timeout socket (buf: its bytearray)."""
    deadline = time.monotonic() + timeout
    while b"\0" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no message")
        p = select.poll()
        p.register(sock, select.POLLIN)
        if not p.poll(remaining * 1000):
            continue
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed by brokerd")
        buf += data
    i = buf.index(b"\0")
    msg = json.loads(bytes(buf[:i]))
    del buf[:i + 1]
    return msg


def queue_waiters_at(path, n):
    """n connections, each an Acquire that queues; returns them in queue order (position 1 first)."""
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        s.connect(path)
        s.sendall(ACQUIRE)
        socks.append(s)
    ep = select.epoll()
    for s in socks:
        ep.register(s.fileno(), select.EPOLLIN)
    by_fd = {s.fileno(): s for s in socks}
    bufs = {s.fileno(): bytearray() for s in socks}
    position = {}
    deadline = time.monotonic() + 120
    while len(position) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(position)} of {n} waiters queued")
        for fd, _ in ep.poll(1.0):
            data = by_fd[fd].recv(65536)
            if not data:
                raise RuntimeError("brokerd closed a waiter's connection")
            bufs[fd] += data
            if b"\0" in bufs[fd] and fd not in position:
                msg = json.loads(bytes(bufs[fd][:bufs[fd].index(b"\0")]))
                if (msg.get("parameters") or {}).get("state") != "queued":
                    raise RuntimeError(f"a waiter got {msg}")
                position[fd] = msg["parameters"]["position"]
                ep.unregister(fd)
    ep.close()
    return sorted(socks, key=lambda s: position[s.fileno()])


def wait_grant(sock, timeout=60):
    """Reads sock's messages until a grant; returns the monotonic time it was read."""
    buf = bytearray()
    while True:
        msg = read_message(sock, buf, timeout)
        if "error" in msg:
            raise RuntimeError(f"the head of the queue got {msg}")
        if (msg.get("parameters") or {}).get("state") == "granted":
            return time.monotonic()


def start_timed(b):
    """Starts brokerd; returns (spawn time, spawn to READY=1, brokerd's CPU time until READY=1)."""
    t = time.monotonic()
    b.start(wait=False)
    spawned = time.monotonic()
    b.store.wait_sent(b.pid, "READY", timeout=120)
    return spawned - t, time.monotonic() - t, cpu_seconds(b.pid)


def stop_timed(b, then=None):
    """SIGTERM; then() once brokerd said STOPPING=1; returns (SIGTERM monotonic time, time to its exit, the
    CPU time brokerd spent from SIGTERM to its exit)."""
    pid = b.pid
    cpu = cpu_seconds(pid)
    t0 = time.monotonic()
    b.proc.send_signal(signal.SIGTERM)
    if then:
        b.store.wait_sent(pid, "STOPPING", timeout=60)
        then()
    _, status, usage = os.wait4(pid, 0)  # its rusage: the CPU time of its whole life
    exited = time.monotonic() - t0
    b.proc.returncode = status = os.waitstatus_to_exitcode(status)
    stop_cpu = usage.ru_utime + usage.ru_stime - cpu
    b.stop()  # gone: closes its log, handles what it sent
    if status != 0:
        raise RuntimeError(f"brokerd exited {status}:\n{b.log()[-3000:]}")
    return t0, exited, stop_cpu


def plain_restart(b):
    """SIGTERM with no client, the store flushed, a start: (SIGTERM to first grant, spawn to READY)."""
    conn = []

    def connect():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        s.connect(b.socket_path)  # into the backlog
        s.sendall(ACQUIRE)
        conn.append(s)
    t0, _, _ = stop_timed(b, connect)
    b.store.flush()
    _, ready, _ = start_timed(b)
    granted = wait_grant(conn[0])
    conn[0].close()
    return granted - t0, ready


def one_round(brokerd, waiters, k, rounds):
    b = Broker(config(waiters), mode="store", debug=False, brokerd=brokerd, store_max=waiters + 100)
    try:
        b.start(timeout=60)
        plain_first, plain_ready = plain_restart(b)
        holder = Varlink(b.socket_path, 30)
        holder.send("io.slotbroker.Acquire", {"lane": "L"}, more=True)
        lease = holder.reply(30)[0]["lease"]["id"]
        t = time.monotonic()
        clients = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--clients", b.socket_path,
                                    str(waiters)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = clients.stdout.readline()
        if line.strip() != "queued":
            raise RuntimeError(f"the clients said {line!r}")
        filled = time.monotonic() - t
        rss_before = rss_kib(b.pid)
        releaser = []

        def release():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            s.connect(b.socket_path)  # into the backlog: the old brokerd accepts nothing more
            s.sendall(Varlink.encode_call("io.slotbroker.Release", {"lease": lease}))
            releaser.append(s)
        old_pid = b.pid
        t0, stopped, stop_cpu = stop_timed(b, release)
        stored = b.store.count()
        state_bytes = len(b.store.read("sb-state")) if "sb-state" in b.store.names() else 0
        mark = len(b.store.received)
        spawn, ready, start_cpu = start_timed(b)
        t_ready = time.monotonic()
        rss_ready = rss_kib(b.pid)
        clients.stdin.write("grant\n")
        clients.stdin.flush()
        line = clients.stdout.readline()
        if not line.startswith("granted "):
            raise RuntimeError(f"the clients said {line!r}")
        granted = float(line.split()[1])  # CLOCK_MONOTONIC, as ours
        first = granted - t0
        rss_after = rss_kib(b.pid)
        time.sleep(2)  # not a synchronisation: does the RSS settle back?
        rss_later = rss_kib(b.pid)
        with b.store.lock:
            received = list(b.store.received)
        stopping = next(t for t, pid, text in received if pid == old_pid and "STOPPING=1" in text)
        stores = [t for t, pid, text in received if pid == old_pid and "FDSTORE=1" in text]
        removes = [t for t, pid, text in received[mark:] if "FDSTOREREMOVE=1" in text]
        # Everything resumed: the other waiters are still queued, the store flushed.
        status = b.status(timeout=60)
        waiting = [p for p in status["pools"] if p["name"] == "p"][0]["waiting"]
        reply = read_message(releaser[0], bytearray(), 30)
        flushed = b.store.count() == 0
        print(f"round {k}/{rounds}: {waiters} waiters queued in {filled:.1f} s; load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"  plain start (no stored fds): SIGTERM to first grant {plain_first:.3f} s, spawn to READY=1 "
              f"{plain_ready:.3f} s")
        print(f"  handover: SIGTERM to first grant {first:.3f} s (target 1 s: ratio {first:.2f}) = stop "
              f"{stopped:.3f} s ({stored} fds stored) + spawn {spawn:.3f} s + start to READY=1 {ready - spawn:.3f} s "
              f"+ READY=1 to the grant {granted - t_ready:.3f} s; without the stand-in's spawn (systemd's, in C, "
              f"is faster) {first - spawn:.3f} s")
        print(f"  brokerd's CPU time (user + system): the stop {stop_cpu:.3f} s, the start to READY=1 {start_cpu:.3f} s "
              f"(what a loaded machine stretches)")
        print(f"  the stop: STOPPING=1 after {stopping - t0:.3f} s, the state stored after {stores[0] - t0:.3f} s, the last "
              f"connections after {stores[-1] - t0:.3f} s ({len(stores)} messages; a state of {state_bytes} bytes), "
              f"exit after {stopped:.3f} s; the "
              f"store flushed {removes[-1] - t_ready:+.3f} s from READY=1" if stores and removes else
              "  (no FDSTORE/FDSTOREREMOVE messages seen)")
        print(f"  RSS: before the stop {rss_before / 1024:.1f} MiB, after taking them back {rss_after / 1024:.1f} MiB "
              f"({100.0 * (rss_after - rss_before) / rss_before:+.1f} %; target within 10 %); at READY=1 "
              f"{rss_ready / 1024:.1f} MiB, 2 s after the grant {rss_later / 1024:.1f} MiB")
        print(f"  the grant went to the head of the queue (position 1 before the stop); {waiting} still waiting (of "
              f"{waiters - 1}); store "
              f"{'flushed' if flushed else 'NOT flushed'}; Release answered {'error' not in reply}", flush=True)
        if waiting != waiters - 1 or "error" in reply:
            raise RuntimeError(f"waiting {waiting}, Release {reply}")
        clients.stdin.close()
        clients.wait(60)
        for s in releaser:
            s.close()
        holder.close()
    finally:
        b.stop()
        b.close_store()
        if os.environ.get("BENCH_KEEP"):
            print(f"  (kept {b.dir})")
        else:
            b.cleanup()


def clients_main(path, n):
    """The child holding the waiters: queues them, says "queued"; on "grant", reads the head's grant and says
    "granted MONOTONIC"; exits when its stdin closes."""
    raise_nofile(n + 1024)
    queue = queue_waiters_at(path, n)
    print("queued", flush=True)
    for line in sys.stdin:
        if line.strip() == "grant":
            print(f"granted {wait_grant(queue[0]):.6f}", flush=True)
    for s in queue:
        s.close()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--clients":
        return clients_main(sys.argv[2], int(sys.argv[3]))
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    brokerd = os.path.abspath(sys.argv[1])
    waiters = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    raise_nofile(waiters + 1024)
    harness.become_subreaper()
    print(f"bench-handover: {brokerd}, {waiters} waiters, {rounds} rounds; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for k in range(1, rounds + 1):
        one_round(brokerd, waiters, k, rounds)


if __name__ == "__main__":
    main()
