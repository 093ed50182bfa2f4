#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-script-cost.py — where a shared pool's script call spends Redis's CPU (issue 11's missed
8,000 pairs/s: one Redis core carries at most 10^6 / (2 × µs per call) pairs/s).

Runs against a redis-server of its own (private port, stopped by pid) the scripts as brokerd loads them
(brokerd/lua: prelude.lua + OP.lua), and truncated variants of them: the prelude with an immediate return
(what defining its functions costs on every EVALSHA), then its steps one by one, then whole calls (tick,
submit + release of an immediate grant). Each figure is Redis's own usec_per_call (INFO commandstats) over
N calls, the median of ROUNDS after one round of warm-up; a variant's cost minus the one before is its
step's. The steps move by ±5-10 µs from one run to the next (Lua's garbage collector runs when it runs):
run it a few times.

Usage: bench-script-cost.py [N] [ROUNDS]   (defaults: 3000 calls, 5 rounds)
A benchmark, not a test: it fails only when something under it fails.
"""
import os
import shutil
import statistics
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import redisd  # noqa: E402

LUA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "brokerd", "lua")
KEY = "{sb:bench}"
CANON = ("backend-node-ttl=30000000\nlane.ci.max-in-use=-1\nlane.ci.priority=0\nlane.ci.reserve=0\n"
         "lane.nightly.max-in-use=-1\nlane.nightly.priority=-1\nlane.nightly.reserve=0\nlimit=64\n")
HEAD = ("1", "n1", "-", "run1", "1")  # version, node, redis clock, run id, settle
TICK_ARGS = ("n1", CANON, 0, 0, 0, "-", "e1", "1", "", "")


def lua(name):
    with open(os.path.join(LUA, name + ".lua")) as f:
        return f.read()


def usec_per_call(r):
    for line in r.call("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_evalsha:"):
            return float(line.split("usec_per_call=")[1].split(",")[0])
    return 0.0


def measure(r, body, n, rounds, args=()):
    sha = r.call("SCRIPT", "LOAD", body)
    samples = []
    for _ in range(rounds + 1):  # the first round warms up (Redis's allocations, Lua's heap): not counted
        r.call("CONFIG", "RESETSTAT")
        for _ in range(n):
            r.send("EVALSHA", sha, 1, KEY, *HEAD, *args)
        for _ in range(n):
            r.read()
        samples.append(usec_per_call(r))
    return statistics.median(samples[1:])


def slowlog_medians(r, names):
    """Median duration (µs) per script, by SHA, of what the SLOWLOG holds (every call: threshold 0)."""
    by_sha = {}
    for entry in r.call("SLOWLOG", "GET", -1):
        args = entry[3]
        if len(args) > 1 and args[0].upper() == "EVALSHA":
            by_sha.setdefault(args[1], []).append(entry[2])
    return {name: statistics.median(by_sha[sha]) for sha, name in names.items() if sha in by_sha}


def measure_pairs(r, n, rounds, prelude):
    """usec_per_call over submit (granted at once) and release, and each one's median from the SLOWLOG
    (whose entries add a little of their own)."""
    submit = r.call("SCRIPT", "LOAD", prelude + "\n" + lua("submit"))
    release = r.call("SCRIPT", "LOAD", prelude + "\n" + lua("release"))
    samples, seq = [], 0
    r.call("CONFIG", "SET", "slowlog-max-len", 2 * n)
    r.call("CONFIG", "SET", "slowlog-log-slower-than", 0)
    for _ in range(rounds + 1):  # the first round warms up: not counted
        r.call("CONFIG", "RESETSTAT")
        r.call("SLOWLOG", "RESET")
        for _ in range(n):
            seq += 1
            rid = "%016x" % seq
            reply = r.call("EVALSHA", submit, 1, KEY, *HEAD, rid, "ci", 1, 1, 0, -1, -1, "-")
            if reply[0] != "ok" or reply[2][0] != "granted":
                raise AssertionError(f"submit: {reply[:3]}")
            reply = r.call("EVALSHA", release, 1, KEY, *HEAD, reply[2][11], rid)
            if reply[0] != "ok":
                raise AssertionError(f"release: {reply[:3]}")
        samples.append(usec_per_call(r))
    samples = samples[1:]
    each = slowlog_medians(r, {submit: "submit", release: "release"})
    r.call("CONFIG", "SET", "slowlog-log-slower-than", 10000)
    return statistics.median(samples), each


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    if redisd.REDIS_SERVER is None:
        print("SKIP: redis-server is not installed")
        return 77
    tmp = tempfile.mkdtemp(prefix="bench-script-cost-")
    server = redisd.RedisServer(tmp, port=0, unix=False).start()
    try:
        r = server.client()
        prelude = lua("prelude")
        tick = prelude + "\n" + lua("tick")
        reply = r.call("EVALSHA", r.call("SCRIPT", "LOAD", tick), 1, KEY, *HEAD, *TICK_ARGS)
        if reply[0] != "ok":
            raise AssertionError(f"tick: {reply[:3]}")
        r.call("HSET", KEY + ":meta", "recovery_until", 0)  # the new pool's window: not what is measured

        steps = [
            ("EVALSHA of `return 1` (Redis's own cost of a script call)", "return 1"),
            ("+ the prelude's definitions (every call runs them)", prelude + "\nreturn 1"),
            ("+ meta_load()", prelude + "\nmeta_load() return 1"),
            ("+ clock() (TIME, HMGET, HSET)", prelude + "\nmeta_load() clock(false) return 1"),
            ("+ rules_load() (HGET and parsing the canon)",
             prelude + "\nmeta_load() clock(false) rules_load() return 1"),
        ]
        load = os.getloadavg()[0]
        print(f"Redis CPU per EVALSHA, µs (median of {rounds} rounds of {n} calls; load average {load:.2f}):")
        before = 0.0
        for label, body in steps:
            cost = measure(r, body, n, rounds, TICK_ARGS)
            print(f"  {cost:7.1f}  (step {cost - before:+6.1f})  {label}")
            before = cost
        print(f"  {measure(r, tick, n, rounds, TICK_ARGS):7.1f}  a whole tick (heartbeat, nothing to settle)")
        pair, each = measure_pairs(r, n // 2, rounds, prelude)
        print(f"  {pair:7.1f}  submit (granted at once) and release, per call: "
              f"one Redis core caps {1e6 / (2 * pair):,.0f} pairs/s")
        print("           the last round's SLOWLOG medians: " +
              ", ".join(f"{name} {us:.0f} µs" for name, us in each.items()))
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        server.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
