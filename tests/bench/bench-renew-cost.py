#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-renew-cost.py — what an idle node's renewal costs a Redis that does nothing else (issue 21 item 3:
where bench-fleet.py's idle 20 × 20 goes).

bench-fleet.py measures a whole fleet of brokerds; this takes the renewal alone. On a private redis-server
(tests/integration/redisd.py: loopback, a free port, no persistence, stopped by pid) with the library as
brokerd loads it, N nodes (default 20) are registered in P pools each (default 20; a tick each) and
covered (two renewals). Then, in turn over ROUNDS rounds of WINDOW seconds, Redis's CPU (INFO cpu, sys + user)
with each of four loads, every one N connections taking turns at one call each every PERIOD seconds
(default 15: an idle node's renewal at the default backend-node-ttl, so N / 15 calls a second in all):

  none    no call (the idle server: its cron; what the others are measured above);
  renew   the renewal as an idle brokerd sends it (FCALL sb_…_renew naming the P pools);
  tiny    an FCALL of a function of another library that returns at once (Redis's own cost of waking
          for a call, reading it, entering Lua and answering: the floor of any renewal in Lua);
  zadd    a ZADD (the floor of any liveness write: one plain command).

Prints each window, then each load's median above the idle server's: per second, per node and per call,
and Redis's whole CPU while the nodes renew (the idle server's share, its cron's visits of N connections,
included), per node and as the share of one core: N = 10,000 is issue 21's fleet of one Redis (goal: at most
20 % of a core, 20 us/s a node, whatever P <= 20), where the calls come 667 a second and Redis is warm.
Also the renewal's own time by INFO commandstats (its FCALL's usec_per_call, the inner commands included).
The P of the renewal is what an O(1) renewal (one that reads nothing per pool) would take off: compare two
runs with P = 1 and P = 20.

Usage: bench-renew-cost.py [P [N [WINDOW [ROUNDS [PERIOD [LUA]]]]]]   (defaults 20, 20, 30, 3, 15, brokerd/lua)
LUA: another tree's brokerd/lua (a commit before a change, to run alternated with this one).
Exit 77 without redis-server. A benchmark, not a test: it fails only when something under it fails.
"""
import os
import statistics
import sys
import tempfile
import time
import unittest

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlua import LUA, library, redisd  # noqa: E402

# The library as brokerd/meson.build embeds it: the operations, then set and batch (library only), last.
OPS = ["submit", "release", "withdraw", "tick", "reclaim", "drain", "positions", "renew", "quarantine", "set",
       "batch"]
CANON = "backend-node-ttl=30000000\nlane.ci.max-in-use=-1\nlane.ci.priority=0\nlane.ci.reserve=0\nlimit=8\n"
TINY = "#!lua name=bench_tiny\nredis.register_function('bench_tiny', function(keys, argv) return { 'ok', 1 } end)"


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    args = [float(a) for a in sys.argv[1:6]]
    pools_n, nodes_n, window, rounds, period = (args + [20, 20, 30, 3, 15][len(args):])[:5]
    where = sys.argv[6] if len(sys.argv) > 6 else LUA
    pools_n, nodes_n, rounds = int(pools_n), int(nodes_n), int(rounds)
    try:
        redisd.require_redis_server()
    except unittest.SkipTest as e:
        print(f"bench-renew-cost: {e}: skipped")
        return 77
    with tempfile.TemporaryDirectory(prefix="bench-renew-cost-") as tmp:
        # A connection a node, as brokerd keeps: Redis's default maxclients (10,000) is raised for a fleet
        # of that size.
        server = redisd.RedisServer(tmp, port=0, unix=False, config={"maxclients": nodes_n + 100}).start()
        try:
            return run(server, pools_n, nodes_n, window, rounds, period, where)
        finally:
            server.close()


def run(server, pools_n, nodes_n, window, rounds, period, where):
    r = server.client(timeout=60)
    text, digest = library(OPS, "bench-renew-cost.py", where)
    r.call("FUNCTION", "LOAD", "REPLACE", text)
    r.call("FUNCTION", "LOAD", "REPLACE", TINY)
    pools = ["{sb:p%d}" % i for i in range(pools_n)]
    nodes = ["n%d/inc%d/" % (i, i) for i in range(nodes_n)]
    conns = [server.client(timeout=60) for _ in nodes]

    def head(node):
        return ("1", node, "-", "run1", "1")  # version, node/incarnation/, redis clock, run id, settle

    # Pipelined a hundred nodes at a time: a fleet of 10,000 × 20 is 200,000 ticks. A tick that answers
    # "settling" (its budget went to earlier instants) is sent again, as brokerd does.
    def tick(node, p):
        return ("FCALL", f"sb_{digest}_tick", 1, p, *head(node), node.split("/")[0], CANON, 0, 0, 0, "-", "e1",
                "1", "", "")

    for first in range(0, nodes_n, 100):
        chunk = [(node, p) for node in nodes[first:first + 100] for p in pools]
        for node, p in chunk:
            r.send(*tick(node, p))
        again = []
        for node, p in chunk:
            reply = r.read()
            if reply[0] == "settling":
                again.append((node, p))
            else:
                assert reply[0] == "ok", reply[:3]
        for node, p in again:
            reply = r.call(*tick(node, p))
            while reply[0] == "settling":
                reply = r.call(*tick(node, p))
            assert reply[0] == "ok", reply[:3]
    ttl_period = "%d/%d" % (30_000_000, int(period * 1e6))

    def renew(i):
        node = nodes[i]
        return conns[i].call("FCALL", f"sb_{digest}_renew", 1, "sb:live:" + node.split("/")[0], *head(node),
                             ttl_period, *pools)

    for _ in range(2):  # the first registers the live key; the second finds every pool covered
        for i in range(nodes_n):
            reply = renew(i)
            assert reply[0] == "ok", reply
    assert all(all(x == 1 for x in renew(i)[2]) for i in range(nodes_n)), "a pool not covered"

    def cpu():
        i = server.info("cpu")
        return (float(i["used_cpu_sys"]) + float(i["used_cpu_user"])) * 1e6

    loads = {
        "none": None,
        "renew": renew,
        "tiny": lambda i: conns[i].call("FCALL", "bench_tiny", 0),
        "zadd": lambda i: conns[i].call("ZADD", "{sem:nodes}", int(time.time() * 1000), "node%d" % i),
    }
    print(f"bench-renew-cost: {nodes_n} nodes x {pools_n} pools, one call a node every {period:g} s "
          f"({nodes_n / period:.2f}/s), windows of {window:g} s, {rounds} rounds, {os.path.relpath(where)} "
          f"(load {load()})", flush=True)
    per_s, fcall_us = {k: [] for k in loads}, []
    for rnd in range(rounds):
        for name, call in loads.items():
            r.call("CONFIG", "RESETSTAT")
            c0, t0, k = cpu(), time.monotonic(), 0
            while True:
                due = t0 + k * period / nodes_n
                if due - t0 >= window:
                    break
                ahead = due - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
                if call:
                    call(k % nodes_n)
                k += 1
            c1, t1 = cpu(), time.monotonic()
            us = (c1 - c0) / (t1 - t0)
            per_s[name].append(us)
            stats = server.info("commandstats")
            own = ""
            if name == "renew" and "cmdstat_fcall" in stats:
                u = float(stats["cmdstat_fcall"].split("usec_per_call=")[1].split(",")[0])
                fcall_us.append(u)
                own = f", its FCALL {u:.1f} us a call (commandstats)"
            print(f"  round {rnd + 1} {name:5s} {us:8.1f} us/s, {k if call else 0} calls{own} (load {load()})",
                  flush=True)
    idle = statistics.median(per_s["none"])
    print(f"Idle server: {idle:.1f} us/s (windows {', '.join('%.0f' % v for v in per_s['none'])})")
    for name in ("renew", "tiny", "zadd"):
        above = statistics.median(per_s[name]) - idle
        print(f"{name:5s}: {above:7.1f} us/s above it, {above / nodes_n:6.1f} us/s a node, "
              f"{above * period / nodes_n:7.1f} us a call")
    # The idle server's share too (its cron visits every connection: ~1 us/s each): what a fleet of N nodes
    # that only renew costs one Redis in all, a node's part and the share of one core.
    whole = statistics.median(per_s["renew"])
    print(f"Redis in all while the nodes renew: {whole:.1f} us/s, {whole / nodes_n:.1f} us/s a node, "
          f"{whole / 1e4:.1f} % of a core")
    print(f"renew's FCALL by commandstats: {statistics.median(fcall_us):.1f} us a call (median of "
          f"{', '.join('%.0f' % v for v in fcall_us)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
