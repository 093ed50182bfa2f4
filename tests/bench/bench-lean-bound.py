#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-lean-bound.py — the most a leaner data model could save of a shared pool's pair in Redis: the library
without three of a lease's structures, timed against the library as it is; and the floor under any library, the
FCALL mechanism alone (tests/bench/README.md, "Stop 69").

The copy drops, with the integrity checks that count them: the `occ` bitmap (a SETBIT at the grant and one at
the release), `sid` (the slot's identity → token: an HSET, an HGET and an HDEL) and a granted lease's record
(HSET and HDEL of `rid`, ZADD and ZREM of `nr:NODE`). It keeps no promise (nothing says whose slot is whose, nor
what a dead node held): it is a bound, not a design. The copy is made in a temporary directory by exact text
replacements in prelude.lua; one that no longer matches exactly once stops the benchmark, naming it (the recipe
must then follow the library). Then bench-batch-cost.py's callgrind mode runs, in this process, with the copy
as BEFORE: the instructions Redis executes per pair, deterministic to a few per cent.

The floor: a library function that takes the same batches (the head, B submits' or releases' arguments, the
copy of each operation's arguments batch.lua makes) and answers decision-shaped replies (a grant's 14 fields
and two tables, the cache once a batch) and decides nothing, sent as the library's are (bench-batch-cost.py's
Form) and timed with them: what the admission rules' Lua and its commands cost is the pair's count above it.

Usage: bench-lean-bound.py [PAIRS] [ROUNDS] [B]   (defaults: 160, 2, 8; B pairs a batch, 1: calls alone)
Needs redis-server and valgrind (callgrind); skipped (77) without them. ~2 minutes with the defaults.
A benchmark, not a test: it fails only when something under it fails.
"""
import importlib.util
import os
import shutil
import sys
import tempfile

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlua import LUA, redisd  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_batch_cost", os.path.join(HERE, "bench-batch-cost.py"))
batch_cost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(batch_cost)

# Decides nothing: the batch's arguments read and copied as batch.lua does, a reply of a decision's shape each.
FLOOR = """#!lua name=slotbroker_floor
local counter = 0
local function batch(keys, argv)
        local n, i, out = tonumber(argv[6]), 7, {}
        for j = 1, n do
                local op, m = argv[i], tonumber(argv[i + 1])
                local a = {}
                for x = 0, m - 1 do a[x + 1] = argv[i + 2 + x] end
                i = i + 2 + m
                counter = counter + 1
                if op == 'submit' then
                        out[j] = { 'ok', 1, { 'granted', a[1], 1, 0, '', '', 'none', 0, -1, 0, 0, counter, { 0 }, {} },
                                   false, false, false }
                else
                        out[j] = { 'ok', 1, { 'released' }, false, false, false }
                end
        end
        out[n][5] = { 0, 0, 0, 0, 0, -1, counter, 'e', 0, '', 64, '', false, false, false }
        return out
end
redis.register_function('sb_floor_batch', batch)
"""


class Floor(batch_cost.Form):
    """FLOOR's batches, sent as bench-batch-cost sends the library's (Form.send(), Form.pairs()): no pool to
    register."""

    def __init__(self, r, b):
        r.call("FUNCTION", "LOAD", "REPLACE", FLOOR)
        self.r, self.label, self.digest, self.key = r, f"floor, batches of {b}", "floor", "{sb:floor}"
        self.batched, self.seq = True, 0

    def register(self):
        pass


# (what, the text in prelude.lua, what replaces it)
CUTS = [
    ("occ set at a grant",
     "                redis.call('SETBIT', K.occ, pos_s, '1')\n"
     "                redis.call('SETBIT', K.busy, pos_s, '1')",
     "                redis.call('SETBIT', K.busy, pos_s, '1')"),
    ("sid set at a grant",
     "        for i = 1, k do redis.call('HSET', K.sid, lease_slot_identity(l, i), token_s) end\n",
     ""),
    ("sid read at a release",
     "                if (pos < R.limit and id ~= (R.members and R.members[pos + 1] or slot_identity(pos))) or\n"
     "                   redis.call('HGET', K.sid, id) ~= token_s then",
     "                if (pos < R.limit and id ~= (R.members and R.members[pos + 1] or slot_identity(pos))) then"),
    ("occ cleared at a release",
     "                redis.call('SETBIT', K.occ, pos_s, '0')\n"
     "                if member_drained_at(pos) then",
     "                if member_drained_at(pos) then"),
    ("sid dropped at a release",
     "                redis.call('HDEL', K.sid, lease_slot_identity(l, i))\n"
     "        end\n"
     "        rests.begin(l)",
     "        end\n"
     "        rests.begin(l)"),
    ("a lease's record written",
     "        record_add = function(node, rid, kind, ref, h)\n"
     "                redis.call('HSET', K.rid, node .. ':' .. rid, ref)\n"
     "                redis.call('ZADD', k_records(node), '0', rid)\n",
     "        record_add = function(node, rid, kind, ref, h)\n"
     "                if kind ~= 'l' then\n"
     "                        redis.call('HSET', K.rid, node .. ':' .. rid, ref)\n"
     "                        redis.call('ZADD', k_records(node), '0', rid)\n"
     "                end\n"),
    ("a lease's record removed",
     "        record_remove = function(node, rid, kind, h)\n"
     "                redis.call('HDEL', K.rid, node .. ':' .. rid)\n"
     "                redis.call('ZREM', k_records(node), rid)\n",
     "        record_remove = function(node, rid, kind, h)\n"
     "                if kind ~= 'l' then\n"
     "                        redis.call('HDEL', K.rid, node .. ':' .. rid)\n"
     "                        redis.call('ZREM', k_records(node), rid)\n"
     "                end\n"),
    ("occ counted",
     "        if redis.call('BITCOUNT', K.occ) ~= M.in_use then return 'slots' end\n",
     ""),
    ("the records counted",
     "        if redis.call('HLEN', K.rid) ~= M.leases - redis.call('ZCARD', K.orph) + M.waiting + "
     "HEALTH.waiting() then\n"
     "                return 'records'\n"
     "        end\n",
     ""),
    ("the node's records counted",
     "        if redis.call('ZSCORE', K.nodes, NODE) and\n"
     "           redis.call('ZCARD', k_records(NODE)) ~= "
     "tonumber(redis.call('HGET', k_node(NODE), 'fp_n') or '0') then\n"
     "                return 'node records'\n"
     "        end\n",
     ""),
]


def lean_copy(where):
    """The library's scripts copied into where/lua, prelude.lua cut; None and a message when a cut misses."""
    dest = os.path.join(where, "lua")
    shutil.copytree(LUA, dest)
    path = os.path.join(dest, "prelude.lua")
    with open(path) as f:
        text = f.read()
    for what, old, new in CUTS:
        n = text.count(old)
        if n != 1:
            return None, f"the cut \"{what}\" matches prelude.lua {n} times, not once: the recipe must follow it"
        text = text.replace(old, new)
    with open(path, "w") as f:
        f.write(text)
    return dest, None


def main():
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 160
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    b = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    if redisd.REDIS_SERVER is None or not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        print("SKIP: redis-server or valgrind (callgrind) is not installed")
        return 77
    with tempfile.TemporaryDirectory(prefix="bench-lean-bound-") as tmp:
        lean, why = lean_copy(tmp)
        if lean is None:
            print(f"bench-lean-bound: {why}")
            return 1
        print(f"BEFORE below is the library without occ, sid and a granted lease's record ({len(CUTS)} cuts)",
              flush=True)
        return batch_cost.callgrind_main(pairs, rounds, b, lean, more=[lambda r: Floor(r, b)])


if __name__ == "__main__":
    sys.exit(main())
