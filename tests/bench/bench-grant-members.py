#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-grant-members.py — what a grant and its release cost in a pool of many members (brokerd/lease.c: the lease
log's "use" record of each member a lease holds, written with each grant and release). Two brokerds in one run:
a pool of MEMBERS members against one of 2, PAIRS Acquire + Release pairs each on one connection, one after
the other; the figure is the difference per pair (the client's round trips are the same in both), in wall time
and in brokerd's CPU time (/proc/PID/stat: utime + stime, 10 ms ticks over the whole loop), which the machine's
load moves far less.

Usage: bench-grant-members.py BROKERD [MEMBERS [PAIRS]]   (default: 12000 2000)
A benchmark, not a test: it fails only when brokerd fails.
"""
import os
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchbrokerd  # noqa: E402


def name(i):
    """Short names (base 36): a config line holds at most 64 KiB, 12,000 of them."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    s = ""
    while True:
        s = digits[i % 36] + s
        i //= 36
        if i == 0:
            return s


def run(brokerd, work, members, pairs):
    d = os.path.join(work, str(members))
    os.makedirs(d)
    sock = os.path.join(d, "sock")
    conf = os.path.join(d, "brokerd.conf")
    with open(conf, "w") as f:
        f.write(f"[pool rigs]\nmembers = {' '.join(name(i) for i in range(members))}\n\n[lane w]\npools = rigs\n")
    with benchbrokerd.started(brokerd, conf, sock, os.path.join(d, "state")) as (p, _):
        c = benchbrokerd.Client(sock)
        for _ in range(50):  # warm up
            c.call("io.slotbroker.Release", {"lease": c.call("io.slotbroker.Acquire", {"lane": "w"})["lease"]["id"]})
        # brokerd's own CPU time too (utime + stime): the machine's load moves it far less than wall time.
        cpu0 = benchbrokerd.cpu_seconds(p.pid)
        start = time.perf_counter()
        for _ in range(pairs):
            lease = c.call("io.slotbroker.Acquire", {"lane": "w"})["lease"]["id"]
            c.call("io.slotbroker.Release", {"lease": lease})
        wall = (time.perf_counter() - start) / pairs
        return wall, (benchbrokerd.cpu_seconds(p.pid) - cpu0) / pairs


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    brokerd = sys.argv[1]
    members = int(sys.argv[2]) if len(sys.argv) > 2 else 12000
    pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    with tempfile.TemporaryDirectory(prefix="bench-grant-members-") as work:
        few = run(brokerd, work, 2, pairs)
        many = run(brokerd, work, members, pairs)
    for n, (wall, cpu) in ((2, few), (members, many)):
        print(f"acquire+release pair, {n:6} members: {wall * 1e6:8.1f} us, brokerd's CPU {cpu * 1e6:8.1f} us")
    print(f"difference per pair: {(many[0] - few[0]) * 1e6:+.1f} us, brokerd's CPU {(many[1] - few[1]) * 1e6:+.1f} us")
    print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
