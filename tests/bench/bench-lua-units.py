#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-lua-units.py — what the pieces of a shared pool's script cost in Redis's own time: a Lua
function call, a table, a tonumber(), a string.format(), a redis.call() of each kind the scripts make, a
value of each kind in a reply. Instruction counts (callgrind: bench-batch-cost.py) weigh a C call by its
instructions, and the two disagree: redis.call()'s "%.17g" of a number is ~3,500 instructions and an
istr() ~1,800, but both take ~200 ns; a strtod() of 16 digits is slow in either. This measures time, so
that a change is weighed by what Redis spends.

Each unit runs N times in one EVAL against a redis-server of its own (private port, stopped by pid), beside
the same loop without it; the figure is the difference of Redis's own usec (INFO commandstats, EVAL), the
fastest of ROUNDS rounds, per unit. A reply's units: one EVAL returns N values of a kind, another returns 1
after making them; the difference is Redis's conversion of a value (Lua table to RESP). The fnv1a32() and
meta's fields are prelude.lua's (its text, and META's 30 fields as a busy pool has them).

Usage: bench-lua-units.py [N] [ROUNDS]   (defaults: 20000, 5)
A benchmark, not a test: it fails only when something under it fails.
"""
import os
import re
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlua import LUA, private_redis, redisd  # noqa: E402

# meta of a busy pool: the fields prelude.lua's meta_load() reads, with values of their usual sizes.
META = {
    "version": "1", "recovery_until": "0", "last_fast": "1765000000123456", "congested": "0",
    "counter": "1765000000654321", "seq": "17", "in_use": "3", "waiting": "0", "drained": "0",
    "drained_free": "0", "phase": "0", "running": "0", "recovery_set": "0", "recovery_from": "0", "leases": "3",
    "nodes": "3", "integrity": "1", "selective": "0", "resting_free": "0", "rest_max": "0",
    "clock_mode": "redis", "drain_next": "0", "epoch": "1765000000000000-3f2a", "hwaiting": "0",
    "lanes_at": "1765000000000000", "life": "0", "run_id": "0" * 40 + "/" + "1" * 40,
    "unsettled_at": "1765000000000001", "recovery_why": "", "drain_records": "0",
}

RID = "0123456789abcdef"

# (label, setup (once an EVAL), unit (N times)). KEYS[1] is a hash of META, KEYS[2] a string key, KEYS[3] a
# sorted set; v a local the loop assigns, so that nothing is optimised away (Lua 5.1 optimises nothing).
UNITS = [
    ("-- Lua", None, None),
    ("a Lua function call", "local function f(a) return a end", "v = f(i)"),
    ("a C function call: type(x)", "", "v = type(i)"),
    ("a table {}", "", "v = {}"),
    ("a table { a = x, b = x }", "", "v = { a = i, b = i }"),
    ("a table { x, x, x }", "", "v = { i, i, i }"),
    ("a string concatenation (the result known)", "local s = 'abc'", "v = s .. 'l'"),
    ("tonumber('0')", "", "v = tonumber('0')"),
    ("tonumber() of 16 digits", "local s = '1765000000123456'", "v = tonumber(s)"),
    ("16 digits + 0 (one strtod())", "local s = '1765000000123456'", "v = s + 0"),
    ("string.find(16 digits, '^%-?%d+$')", "local s = '1765000000123456'", "v = string.find(s, '^%-?%d+$')"),
    ("string.format('%d', 16 digits) (istr())", "local n = 1765000000123456", "v = string.format('%d', n)"),
    ("cmsgpack.pack() of a lease record",
     "local r = { 'node-a', '" + RID + "', 'ci', 1, { 3 }, { 3 }, {}, 1765000000123456, 0, 'none', 0, -1, 0, 0, 123456789 }",
     "v = cmsgpack.pack(r)"),
    ("cmsgpack.unpack() of it",
     "local p = cmsgpack.pack({ 'node-a', '" + RID + "', 'ci', 1, { 3 }, { 3 }, {}, 1765000000123456, 0, 'none', 0, "
     "-1, 0, 0, 123456789 })",
     "v = cmsgpack.unpack(p)"),
    ("fnv1a32() of a rid and its kind (prelude.lua's)", "FNV", "v = fnv1a32('" + RID + "l')"),
    ("-- redis.call()", None, None),
    ("TIME", "", "v = redis.call('TIME')"),
    ("HGET, a field there", "", "v = redis.call('HGET', KEYS[1], 'in_use')"),
    ("HSET of a string", "", "v = redis.call('HSET', KEYS[2] .. 'h', 'f', '1765000000123456')"),
    ("HSET of a number (printed with %.17g)", "local n = 1765000000123456",
     "v = redis.call('HSET', KEYS[2] .. 'h', 'f', n)"),
    ("SETBIT, its offset a string", "", "v = redis.call('SETBIT', KEYS[2], '5', '1')"),
    ("ZRANGE 0 1 WITHSCORES", "", "v = redis.call('ZRANGE', KEYS[3], '0', '1', 'WITHSCORES')"),
    ("HMGET of 5 fields", "", "v = redis.call('HMGET', KEYS[1], 'in_use', 'waiting', 'leases', 'counter', 'seq')"),
    ("HGETALL of meta (30 fields)", "", "v = redis.call('HGETALL', KEYS[1])"),
    ("HGETALL of meta, into a table (meta_load()'s first loop)", "",
     "local a = redis.call('HGETALL', KEYS[1]) local M = {} for j = 1, #a, 2 do M[a[j]] = a[j + 1] end v = M"),
]

# A reply's values: (label, the Lua expression of one value).
REPLY = [
    ("a number", "1765000000123456"),
    ("a string", "'" + RID + "'"),
    ("false (nil)", "false"),
    ("an empty table", "{}"),
    ("a table of 2 numbers", "{ 1, 2 }"),
]


def fnv_source():
    """prelude.lua's fnv1a32(), as it is there (a `local function` or a `do` block)."""
    with open(os.path.join(LUA, "prelude.lua")) as f:
        text = f.read()
    m = re.search(r"^local function fnv1a32\(s\)\n.*?^end\n", text, re.S | re.M)
    if not m:
        m = re.search(r"^local fnv1a32\ndo.*?^end\n", text, re.S | re.M)
    if not m:
        raise AssertionError("prelude.lua: no fnv1a32()")
    return m.group(0)


def eval_usec(r, script, keys, n):
    """Redis's own usec of one EVAL of script (INFO commandstats)."""
    r.call("CONFIG", "RESETSTAT")
    r.call("EVAL", script, len(keys), *keys, n)
    for line in r.call("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_eval:"):
            return int(re.search(r"usec=(\d+)", line).group(1))
    raise AssertionError("no EVAL in INFO commandstats")


def loop(setup, unit):
    return ("local v\n" + (setup or "") + "\nlocal n = tonumber(ARGV[1])\nfor i = 1, n do\n" + (unit or "") +
            "\nend\nreturn 1")


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    if redisd.REDIS_SERVER is None:
        print("SKIP: redis-server is not installed")
        return 77
    with private_redis("bench-lua-units-") as server:
        r = server.client()
        keys = ["{u}:meta", "{u}:s", "{u}:z"]
        flat = [x for kv in META.items() for x in kv]
        r.call("HSET", keys[0], *flat)
        r.call("ZADD", keys[2], "1765000000000001", "node-a", "1765000000000002", "node-b")
        fnv = fnv_source()

        def best(script):
            return min(eval_usec(r, script, keys, n) for _ in range(rounds))

        base = best(loop("", ""))
        load = os.getloadavg()
        print(f"Redis's own time a unit, ns: the fastest of {rounds} EVALs of {n}, less the same loop without the "
              f"unit (a bare iteration: {base * 1000 / n:.0f} ns); load average {load[0]:.2f}")
        for label, setup, unit in UNITS:
            if setup is None:
                print(label)
                continue
            if setup == "FNV":
                setup = fnv
            t = best(loop(setup, unit)) - best(loop(setup, ""))
            print(f"  {t * 1000 / n:8.0f}  {label}")
        print("-- a reply (Redis converts each value of a script's reply from Lua; per value)")
        for label, expr in REPLY:
            made = "local t = {}\nfor i = 1, tonumber(ARGV[1]) do t[i] = " + expr + " end\n"
            t = best(made + "return t") - best(made + "return 1")
            print(f"  {t * 1000 / n:8.0f}  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
