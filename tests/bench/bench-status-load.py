#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-status-load.py — what clients that ask for Metrics or Status back to back cost everybody else (SPEC §10:
nothing a client does stalls the loop). One brokerd with a pool of MEMBERS members (a member pool's Metrics text
has a line per member in four families, its Status a name per member); one client times Acquire + Release pairs,
one every 10 ms, for SECONDS: alone, then while CLIENTS connections (driven by one other process) each send
Metrics again as soon as its reply is in, then the same with Status. Prints each window's pair latency (p50, p99,
max), the calls the CLIENTS got answered per second and brokerd's CPU time, and the loaded windows' p50 and p99
as ratios to the quiet one's (measured in one run: the machine may be shared).

Usage: bench-status-load.py BROKERD [MEMBERS [CLIENTS [SECONDS]]]   (default: 1500 50 5)
A benchmark, not a test: it fails only when brokerd fails.
"""
import json
import multiprocessing
import os
import selectors
import socket
import statistics
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchbrokerd  # noqa: E402


def hammer(path, method, n, stop, answered):
    """n connections, each sending `method` again as soon as its reply is in, until stop is set."""
    call = json.dumps({"method": method}).encode() + b"\0"
    sel = selectors.DefaultSelector()
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.sendall(call)
        sel.register(s, selectors.EVENT_READ)
    buf = bytearray(1 << 20)
    count = 0
    while not stop.is_set():
        for key, _ in sel.select(timeout=0.1):
            k = key.fileobj.recv_into(buf)
            if k == 0:
                sys.exit(f"bench-status-load: brokerd closed a {method} connection")
            if buf[k - 1] == 0:  # a reply ends with its NUL, and each connection has one call out at a time
                count += 1
                key.fileobj.sendall(call)
    answered.value = count


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def window(c, pid, seconds):
    """Acquire + Release pairs, one every 10 ms: their latencies (s), and brokerd's CPU seconds meanwhile."""
    lat, cpu0, end = [], benchbrokerd.cpu_seconds(pid), time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        c.call("io.slotbroker.Release", {"lease": c.call("io.slotbroker.Acquire", {"lane": "w"})["lease"]["id"]})
        lat.append(time.perf_counter() - t)
        time.sleep(0.01)
    return lat, benchbrokerd.cpu_seconds(pid) - cpu0


def loaded(path, c, pid, method, n, seconds):
    stop, answered = multiprocessing.Event(), multiprocessing.Value("q", 0)
    p = multiprocessing.Process(target=hammer, args=(path, method, n, stop, answered))
    p.start()
    time.sleep(0.5)  # its connections are up and calling
    try:
        lat, cpu = window(c, pid, seconds)
    finally:
        stop.set()
        p.join()
    if p.exitcode != 0:
        sys.exit(f"bench-status-load: the {method} clients failed")
    return lat, cpu, answered.value / (seconds + 0.5)


def name(i):
    return f"rig-{i:05d}"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    brokerd = sys.argv[1]
    members = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 5.0
    with tempfile.TemporaryDirectory(prefix="bench-status-load-") as work:
        sock, conf = os.path.join(work, "sock"), os.path.join(work, "brokerd.conf")
        with open(conf, "w") as f:
            f.write(f"[pool rigs]\nmembers = {' '.join(name(i) for i in range(members))}\n\n[lane w]\npools = rigs\n")
        with benchbrokerd.started(brokerd, conf, sock, os.path.join(work, "state")) as (p, _):
            c = benchbrokerd.Client(sock)
            size = {m: len(json.dumps(c.call(f"io.slotbroker.{m}", {}))) for m in ("Metrics", "Status")}
            print(f"{members} members: Metrics reply {size['Metrics'] / 1024:.0f} KiB, Status reply "
                  f"{size['Status'] / 1024:.0f} KiB; {n} clients; windows of {seconds:g} s; "
                  f"load average {os.getloadavg()[0]:.2f}", flush=True)
            for _ in range(50):  # warm up
                c.call("io.slotbroker.Release", {"lease": c.call("io.slotbroker.Acquire", {"lane": "w"})["lease"]["id"]})
            quiet, cpu = window(c, p.pid, seconds)
            rows = [("alone", quiet, cpu, None)]
            for method in ("Metrics", "Status"):
                lat, cpu, rate = loaded(sock, c, p.pid, f"io.slotbroker.{method}", n, seconds)
                rows.append((f"{n} x {method}", lat, cpu, rate))
    base = (statistics.median(quiet), percentile(quiet, 0.99))
    for label, lat, cpu, rate in rows:
        p50, p99 = statistics.median(lat), percentile(lat, 0.99)
        print(f"{label:>12}: acquire+release p50 {p50 * 1e3:8.2f} ms  p99 {p99 * 1e3:8.2f} ms  max "
              f"{max(lat) * 1e3:8.2f} ms  ({len(lat)} pairs; x{p50 / base[0]:.1f} p50, x{p99 / base[1]:.1f} p99)"
              f"; brokerd's CPU {cpu / seconds * 100:3.0f}%" + (f"; {rate:.0f} answers/s to the {n}" if rate else ""))
    print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
