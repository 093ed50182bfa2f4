#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-batch-cost.py — what a shared pool's pair (a submit granted at once, then its release) costs Redis
when each operation is its own FCALL and when a node's operations of one loop iteration go as one batch
(brokerd/lua/batch.lua, issue 21 item 2), and with the library of another source tree (BEFORE, e.g. main's
brokerd/lua exported with `git archive`) one by one, in one run on one redis-server of its own (private
port, stopped by pid).

Per form: Redis's CPU per pair (INFO cpu, sys + user, over the rounds: what the host pays, the call's
dispatch and reply included), the script time per pair (INFO commandstats usec of FCALL; the semaphore's:
of its EVALSHA and ZREM, issue 21's "top-level commands" measure), the FCALLs per
pair, and the commands the scripts ran per operation (every command in commandstats but FCALL, over the
operations), with the Redis keys left afterwards (one per decided request before: the outcome keys).
The pairs go B at a time (B submits, then B releases: what a busy node's outbox holds), pipelined.
Rounds of the forms are taken in turn (the machine's load falls on each alike); medians are printed.
The reference, in the same Redis and rounds: issue 21's plain lease semaphore, a pair being an acquire
(one EVALSHA: ZREMRANGEBYSCORE of the expired, ZCARD, ZADD of the holder with its expiry, PEXPIRE) and a
release (ZREM), sent B at a time as the forms' are; each form's Redis CPU per pair is also given as a ratio
to it (issue 21's goal: ≤ 10).

Usage: bench-batch-cost.py [PAIRS] [ROUNDS] [B] [BEFORE]   (defaults: 4000, 5, 8)
With $BENCH_BATCH_COST_CALLGRIND=1, redis-server runs under `valgrind --tool=callgrind --instr-atstart=no`
and the figure is the instructions it executes per pair (Ir, every thread: the calls' parsing, the scripts,
the replies' writes), counted only while a form's pairs run (callgrind_control -i): deterministic to a few
per cent whatever the machine's load, where the CPU times above move by ±15 % on this VM. PAIRS is then
better a few hundred (callgrind runs Redis ~50× slower); the warm-up is a round of PAIRS / 4.
A benchmark, not a test: it fails only when something under it fails.
"""
import os
import glob
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlua  # noqa: E402
from benchlua import LUA, redisd  # noqa: E402

OPS = ["submit", "release", "withdraw", "tick", "reclaim", "drain", "positions"]
CANON = "backend-node-ttl=30000000\nlane.ci.max-in-use=-1\nlane.ci.priority=0\nlane.ci.reserve=0\nlimit=64\n"
HEAD = ("1", "n1", "-", "run1", "1")  # version, node, redis clock, run id, settle


def library(where):
    batch = ["batch"] if os.path.exists(os.path.join(where, "batch.lua")) else []  # (a BEFORE tree without)
    return benchlua.library(OPS + batch, "bench-batch-cost.py", where)


def stats(r):
    cpu, calls, fcalls, fusec = 0.0, 0, 0, 0
    for line in r.call("INFO", "all").splitlines():
        if line.startswith("used_cpu_sys:") or line.startswith("used_cpu_user:"):
            cpu += float(line.split(":")[1])
        if line.startswith("cmdstat_"):
            name, rest = line.split(":", 1)
            f = dict(kv.split("=") for kv in rest.split(","))
            if name == "cmdstat_fcall":
                fcalls, fusec = int(f["calls"]), int(f["usec"])
            elif name not in ("cmdstat_info", "cmdstat_config", "cmdstat_dbsize"):
                calls += int(f["calls"])
    return cpu * 1e6, calls, fcalls, fusec


class Form:
    def __init__(self, r, label, digest, key, batched):
        self.r, self.label, self.digest, self.key, self.batched = r, label, digest, key, batched
        self.seq = 0
        self.samples = {"cpu": [], "script": [], "fcalls": [], "commands": []}
        self.register()
        r.call("HSET", key + ":meta", "recovery_until", 0)  # the new pool's window: not what is measured

    def register(self):
        """A heartbeat (before each round, not counted): a round on a loaded machine may outlast the TTL."""
        reply = self.r.call("FCALL", f"sb_{self.digest}_tick", 1, self.key, *HEAD, "n1", CANON, 0, 0, 0, "-", "e1",
                            "1", "", "")
        assert reply[0] == "ok", reply[:3]

    def send(self, ops):
        """ops: [(op, args)…], sent one by one or as one batch; returns the replies, in order."""
        if not self.batched:
            for op, args in ops:
                self.r.send("FCALL", f"sb_{self.digest}_{op}", 1, self.key, *HEAD, *args)
            return [self.r.read() for _ in ops]
        flat = []
        for op, args in ops:
            flat += [op, len(args), *args]
        return self.r.call("FCALL", f"sb_{self.digest}_batch", 1, self.key, *HEAD, len(ops), *flat)

    def round(self, pairs, b):
        self.register()
        self.r.call("CONFIG", "RESETSTAT")
        cpu0 = stats(self.r)[0]
        self.pairs(pairs, b)
        cpu, calls, fcalls, fusec = stats(self.r)
        n = (pairs // b) * b
        self.samples["cpu"].append((cpu - cpu0) / n)
        self.samples["script"].append(fusec / n)
        self.samples["fcalls"].append(fcalls / n)
        self.samples["commands"].append(calls / (2 * n))

    def pairs(self, pairs, b):
        for _ in range(pairs // b):
            rids = []
            for _ in range(b):
                self.seq += 1
                rids.append("%016x" % self.seq)
            replies = self.send([("submit", benchlua.submit_args(rid)) for rid in rids])
            tokens = []
            for rid, reply in zip(rids, replies):
                assert reply[0] == "ok" and reply[2][0] == "granted", (self.label, reply[:3])
                tokens.append(reply[2][11])
            replies = self.send([("release", (t, rid)) for t, rid in zip(tokens, rids)])
            assert len(replies) == b and all(x[0] == "ok" for x in replies), (self.label, replies)


SEMAPHORE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('PEXPIRE', KEYS[1], 30000)
return 1
"""


class Semaphore(Form):
    """Issue 21's plain lease semaphore: a sorted set of holders scored by their expiry (ms)."""

    def __init__(self, r):
        self.r, self.label, self.key, self.batched = r, "lease semaphore", "{sem:pool}", False
        self.seq = 0
        self.samples = {"cpu": [], "script": [], "fcalls": [], "commands": []}
        self.sha = r.call("SCRIPT", "LOAD", SEMAPHORE)

    def register(self):
        pass

    def round(self, pairs, b):
        self.r.call("CONFIG", "RESETSTAT")
        cpu0 = stats(self.r)[0]
        self.pairs(pairs, b)
        cpu, calls, _, _ = stats(self.r)
        usec = 0
        for line in self.r.call("INFO", "commandstats").splitlines():
            if line.startswith("cmdstat_evalsha:") or line.startswith("cmdstat_zrem:"):
                usec += int(line.split("usec=")[1].split(",")[0])
        n = (pairs // b) * b
        self.samples["cpu"].append((cpu - cpu0) / n)
        self.samples["script"].append(usec / n)
        self.samples["fcalls"].append(0.0)
        self.samples["commands"].append(calls / (2 * n))

    def pairs(self, pairs, b):
        for _ in range(pairs // b):
            now = int(time.time() * 1000)
            holders = []
            for _ in range(b):
                self.seq += 1
                holders.append("n1:%016x" % self.seq)
                self.r.send("EVALSHA", self.sha, 1, self.key, now, now + 30000, 64, holders[-1])
            assert all(self.r.read() == 1 for _ in holders), self.label
            for h in holders:
                self.r.send("ZREM", self.key, h)
            assert all(self.r.read() == 1 for _ in holders), self.label


class CallgrindRedis(redisd.RedisServer):
    """redis-server under callgrind, instrumentation off until a form's pairs run."""

    def argv(self):
        return ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=no",
                f"--callgrind-out-file={self.dir}/callgrind.out.%p"] + super().argv()

    def instructions(self, run):
        """Ir executed by run() with instrumentation on, from a dump of its own."""
        pid = str(self.pid)
        quiet = {"check": True, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        subprocess.run(["callgrind_control", "-z", pid], **quiet)
        subprocess.run(["callgrind_control", "-i", "on", pid], **quiet)
        run()
        subprocess.run(["callgrind_control", "-i", "off", pid], **quiet)
        before = set(glob.glob(f"{self.dir}/callgrind.out.{pid}.*"))
        subprocess.run(["callgrind_control", "-d", pid], **quiet)
        (dump,) = set(glob.glob(f"{self.dir}/callgrind.out.{pid}.*")) - before
        with open(dump) as f:
            for line in f:
                if line.startswith("totals:"):  # ("summary:" says 0 in a dump asked by callgrind_control)
                    return int(line.split()[1])
        raise AssertionError(f"{dump}: no totals")


def callgrind_main(pairs, rounds, b, before, more=()):
    """more: functions that make further forms on the server's client (bench-lean-bound.py's floor), timed
    with the others, before the semaphore."""
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        print("SKIP: valgrind (callgrind) is not installed")
        return 77
    tmp = tempfile.mkdtemp(prefix="bench-batch-cost-")
    server = CallgrindRedis(tmp, port=0, unix=False).start(timeout=120)
    try:
        r = server.client(timeout=60)
        forms = []
        for where, tag in [(LUA, "")] + ([(before, "BEFORE, ")] if before else []):
            text, digest = library(where)
            r.call("FUNCTION", "LOAD", "REPLACE", text)
            key = "{sb:cg%d}" % len(forms)
            forms.append(Form(r, f"{tag}batches of {b}", digest, key, True))
        forms += [make(r) for make in more]
        forms.append(Semaphore(r))
        n = (pairs // b) * b
        samples = {f.label: [] for f in forms}
        for f in forms:
            f.register()
            f.pairs(max(b, pairs // 4), b)
        for _ in range(rounds):
            for f in forms:
                f.register()
                samples[f.label].append(server.instructions(lambda: f.pairs(pairs, b)) / n)
        load = os.getloadavg()
        print(f"{n} pairs (submit granted at once + release) per round, {b} at a time, redis-server under "
              f"callgrind, median of {rounds} rounds after a warm-up; load average {load[0]:.2f} {load[1]:.2f}")
        sem = statistics.median(samples[forms[-1].label]) or float("nan")
        for f in forms:
            med = statistics.median(samples[f.label])
            print(f"  {f.label:<22}{med:12,.0f} Ir/pair   ratio to the semaphore {med / sem:5.1f}"
                  f"   (rounds: {', '.join('%.0f' % x for x in samples[f.label])})")
    finally:
        server.stop(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def main():
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    b = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    before = sys.argv[4] if len(sys.argv) > 4 else None
    if redisd.REDIS_SERVER is None:
        print("SKIP: redis-server is not installed")
        return 77
    if os.environ.get("BENCH_BATCH_COST_CALLGRIND") == "1":
        return callgrind_main(pairs, rounds, b, before)
    with benchlua.private_redis("bench-batch-cost-") as server:
        r = server.client()
        text, digest = library(LUA)
        r.call("FUNCTION", "LOAD", "REPLACE", text)
        forms = [Form(r, "one by one", digest, "{sb:one}", False),
                 Form(r, f"batches of {b}", digest, "{sb:batch}", True)]
        if before:
            text, old = library(before)
            r.call("FUNCTION", "LOAD", "REPLACE", text)
            forms.append(Form(r, "BEFORE, one by one", old, "{sb:before}", False))
            if os.path.exists(os.path.join(before, "batch.lua")):
                forms.append(Form(r, f"BEFORE, batches of {b}", old, "{sb:beforeb}", True))
        forms.append(Semaphore(r))
        for i in range(rounds + 1):
            for f in forms:
                f.round(pairs, b)
        load = os.getloadavg()
        print(f"{pairs} pairs (submit granted at once + release) per round, {b} at a time, median of {rounds} rounds "
              f"after a warm-up; load average {load[0]:.2f} {load[1]:.2f}")
        print(f"  {'form':<22}{'Redis CPU/pair':>16}{'script/pair':>14}{'FCALL/pair':>12}{'cmds/op':>9}{'keys left':>11}")
        for f in forms:
            med = {k: statistics.median(v[1:]) for k, v in f.samples.items()}
            keys = len(r.call("KEYS", f.key + "*"))
            print(f"  {f.label:<22}{med['cpu']:13.1f} µs{med['script']:11.1f} µs{med['fcalls']:12.2f}"
                  f"{med['commands']:9.1f}{keys:11d}")
        base = statistics.median(forms[0].samples["cpu"][1:])
        sem = statistics.median(forms[-1].samples["cpu"][1:])
        for f in forms[1:-1]:
            print(f"  {f.label} / one by one, Redis CPU per pair: {statistics.median(f.samples['cpu'][1:]) / base:.2f}")
        sem_usec = statistics.median(forms[-1].samples["script"][1:])
        for f in forms[:-1]:
            print(f"  {f.label} / lease semaphore: Redis CPU per pair "
                  f"{statistics.median(f.samples['cpu'][1:]) / sem:.1f}, commands' time per pair "
                  f"{statistics.median(f.samples['script'][1:]) / sem_usec:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
