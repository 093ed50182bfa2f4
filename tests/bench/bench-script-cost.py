#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-script-cost.py — where a shared pool's script call spends Redis's CPU (issue 11's missed
8,000 pairs/s: one Redis core carries at most 10^6 / (2 × µs per call) pairs/s), called as brokerd calls
it (FCALL of the Redis Functions library) and as brokerds before the library did (EVALSHA of prelude.lua +
OP.lua), side by side in one run: on a shared machine, compare the ratios, not the figures of two runs.

Runs against a redis-server of its own (private port, stopped by pid) the operations, and truncated
variants of them: an immediate return (Redis's own cost of a call), the prelude's start of a call (EVALSHA:
defining its functions, every call; FCALL: call_begin()), then its steps one by one, then whole calls (tick,
submit + release of an immediate grant). Each figure is Redis's own usec_per_call (INFO commandstats) over
N calls, the median of ROUNDS after one round of warm-up (the forms' rounds taken in turn, so that the
machine's load falls on each alike); a variant's cost minus the one before is its
step's. The steps move by ±5-10 µs from one run to the next (Lua's garbage collector runs when it runs):
run it a few times.

With BEFORE (a brokerd/lua directory of an older version, e.g. `git archive` of main's), its
prelude.lua + OP.lua are measured by EVALSHA too, as they were (without eval.lua).

Usage: bench-script-cost.py [N] [ROUNDS] [BEFORE]   (defaults: 3000 calls, 5 rounds)
A benchmark, not a test: it fails only when something under it fails.
"""
import os
import statistics
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlua import LUA, embed, private_redis, redisd, submit_args  # noqa: E402

KEY = "{sb:bench}"
CANON = ("backend-node-ttl=30000000\nlane.ci.max-in-use=-1\nlane.ci.priority=0\nlane.ci.reserve=0\n"
         "lane.nightly.max-in-use=-1\nlane.nightly.priority=-1\nlane.nightly.reserve=0\nlimit=64\n")
HEAD = ("1", "n1", "-", "run1", "1")  # version, node, redis clock, run id, settle
TICK_ARGS = ("n1", CANON, 0, 0, 0, "-", "e1", "1", "", "")

# The variants: (label, body after the prelude's start of a call). None: the operation's file.
STEPS = [
    ("+ the prelude's start of a call (EVALSHA: ~100 `local function`s made anew; FCALL: call_begin())",
     "return 1"),
    ("+ meta_load() (HGETALL)", "meta_load() return 1"),
    ("+ clock() (TIME, HMGET, HSET)", "meta_load() clock(false) return 1"),
    ("+ rules_load() (HGET; EVALSHA: the canon parsed again; FCALL: kept)",
     "meta_load() clock(false) rules_load() return 1"),
]


def lua(name, where=LUA):
    with open(os.path.join(where, name + ".lua")) as f:
        return f.read()


class Form:
    """One way of calling: EVALSHA of scripts, or FCALL of a library's functions."""

    def __init__(self, r, kind, where=LUA):
        self.r, self.kind, self.where = r, kind, where
        self.prelude = lua("prelude", where)
        # An older version has no eval.lua: its prelude reads KEYS and ARGV at its top level.
        self.begin = lua("eval", where) if os.path.exists(os.path.join(where, "eval.lua")) else ""

    def load(self, name, body):
        """The callee of a variant: body runs after the prelude's start of a call."""
        if self.kind == "EVALSHA":
            return self.r.call("SCRIPT", "LOAD", self.prelude + "\n" + self.begin + body)
        text, digest = embed.library(self.prelude.encode(), [(name, body.encode())], "bench-script-cost.py")
        self.r.call("FUNCTION", "LOAD", "REPLACE", text.decode())
        return f"sb_{digest}_{name}"

    def load_bare(self):
        """Redis's own cost of a call: `return 1` without the prelude."""
        if self.kind == "EVALSHA":
            return self.r.call("SCRIPT", "LOAD", "return 1")
        self.r.call("FUNCTION", "LOAD", "REPLACE",
                    "#!lua name=bench_bare\nredis.register_function('bench_bare', function() return 1 end)")
        return "bench_bare"

    def usec_per_call(self):
        key = "cmdstat_" + self.kind.lower() + ":"
        for line in self.r.call("INFO", "commandstats").splitlines():
            if line.startswith(key):
                return float(line.split("usec_per_call=")[1].split(",")[0])
        return 0.0

    def round(self, callee, n, args=()):
        """One round: usec_per_call over n pipelined calls."""
        self.r.call("CONFIG", "RESETSTAT")
        for _ in range(n):
            self.r.send(self.kind, callee, 1, KEY, *HEAD, *args)
        for _ in range(n):
            self.r.read()
        return self.usec_per_call()

    def round_pairs(self, callees, n, seq):
        """One round of n submits (granted at once) and releases: usec_per_call over them, and the next seq."""
        submit, release = callees
        self.r.call("CONFIG", "RESETSTAT")
        for _ in range(n):
            seq += 1
            rid = "%016x" % seq
            reply = self.r.call(self.kind, submit, 1, KEY, *HEAD, *submit_args(rid))
            if reply[0] != "ok" or reply[2][0] != "granted":
                raise AssertionError(f"{self.kind} submit: {reply[:3]}")
            reply = self.r.call(self.kind, release, 1, KEY, *HEAD, reply[2][11], rid)
            if reply[0] != "ok":
                raise AssertionError(f"{self.kind} release: {reply[:3]}")
        return self.usec_per_call(), seq


def interleaved(forms, rounds, one_round):
    """Medians per form of rounds taken in turn, form after form (the machine's load falls on each alike),
    after one warm-up round each (Redis's allocations, Lua's heap): not counted."""
    samples = {name: [] for name, _ in forms}
    for _ in range(rounds + 1):
        for name, f in forms:
            samples[name].append(one_round(name, f))
    return {name: statistics.median(v[1:]) for name, v in samples.items()}


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    before = sys.argv[3] if len(sys.argv) > 3 else None
    if redisd.REDIS_SERVER is None:
        print("SKIP: redis-server is not installed")
        return 77
    with private_redis("bench-script-cost-") as server:
        r = server.client()
        forms = [("FCALL", Form(r, "FCALL")), ("EVALSHA", Form(r, "EVALSHA"))]
        if before:
            forms.append(("EVALSHA before", Form(r, "EVALSHA", before)))
        fcall = forms[0][1]
        reply = r.call("FCALL", fcall.load("tick", lua("tick")), 1, KEY, *HEAD, *TICK_ARGS)
        if reply[0] != "ok":
            raise AssertionError(f"tick: {reply[:3]}")
        r.call("HSET", KEY + ":meta", "recovery_until", 0)  # the new pool's window: not what is measured

        load = os.getloadavg()[0]
        print(f"Redis CPU per call, µs (median of {rounds} rounds of {n} calls; load average {load:.2f}); "
              f"each column's step in parentheses:")
        print("  " + "".join(f"{name:>22}" for name, _ in forms) + "   FCALL/EVALSHA")
        rows = [("return 1 (Redis's own cost of a call)", lambda f: f.load_bare())]
        rows += [(label, lambda f, body=body: f.load("step", body)) for label, body in STEPS]
        rows.append(("a whole tick (heartbeat, nothing to settle)", lambda f: f.load("tick", lua("tick", f.where))))
        last = {name: 0.0 for name, _ in forms}
        for i, (label, make) in enumerate(rows):
            callees = {name: make(f) for name, f in forms}
            costs = interleaved(forms, rounds, lambda name, f: f.round(callees[name], n, TICK_ARGS))
            cells = []
            for name, f in forms:
                cost = costs[name]
                step = f" ({cost - last[name]:+5.1f})" if 0 < i < len(rows) - 1 else "        "
                cells.append(f"{cost:14.1f}{step}")
                if i < len(rows) - 1:
                    last[name] = cost
            print("  " + "".join(cells) + f"   {costs['FCALL'] / costs['EVALSHA']:5.2f}  {label}")
        callees = {name: (f.load("submit", lua("submit", f.where)), f.load("release", lua("release", f.where)))
                   for name, f in forms}
        seq = [0]

        def pairs(name, f):
            cost, seq[0] = f.round_pairs(callees[name], n // 2, seq[0])
            return cost
        costs = interleaved(forms, rounds, pairs)
        cells = [f"{costs[name]:14.1f}        " for name, _ in forms]
        print("  " + "".join(cells) + f"   {costs['FCALL'] / costs['EVALSHA']:5.2f}  "
              "submit (granted at once) and release, per call")
        print("  one Redis core caps: " + ", ".join(f"{name} {1e6 / (2 * costs[name]):,.0f} pairs/s"
                                                    for name, _ in forms))
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
