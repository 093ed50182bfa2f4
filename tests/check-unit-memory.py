#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""brokerd.service's MemoryHigh= and MemoryMax= (system and user units) are what brokerd's own limits add
up to at their defaults, as brokerd(8) MEMORY tells the sum: a limit changed in the code without the
units fails here.

The limits are read from the source (libbroker/conf.c's defaults, brokerd's bounds); what the code does
not bound by a constant is an estimate written here, each with where it comes from:

  connections   max-connections × (PER_CONNECTION + max-message-size)   every client mid-message
  output        max-connections × max-output-per-connection             clients that do not read
  history       HISTORY_BACKLOG_MAX × (JOB_MAX + ROW_OVERHEAD) + ROW_BLOCK_SIZE × ROW_BLOCKS_SPARE_MAX
  journal       JOURNAL_BACKLOG_MAX × JOURNAL_ENTRY
  redis         REDIS_LINKS × REDIS_REPLY_BYTES_MAX                      replies being read
  base          BASE                                                     code, SQLite caches, allocator

MemoryHigh= is the sum without `output` (what a brokerd whose clients read their replies can need),
MemoryMax= the whole sum, each rounded up to a multiple of 256 MiB.

No ProcSubset=pid either: it hides /proc/sys/kernel/random/boot_id, which dates the handed-over state
(without it, every restart closed the waiters' connections: the systemd lane found it).

FileDescriptorStoreMax= is max-connections + 1: every client connection and the memfd with their state,
handed to systemd's fd store at a restart (brokerd(8), RESTART BEHAVIOUR). Fewer would make systemd close
the last connections of a full brokerd at every restart (their clients queue again).

Usage: check-unit-memory.py SOURCE_ROOT [--print]
"""
import math
import os
import re
import sys

KIB, MIB = 1024, 1024 * 1024
PER_CONNECTION = 8 * KIB      # a connection's session, stream and request: bench-waiters, < 6.5 KiB a waiter
ROW_OVERHEAD = 512            # a history row besides its job label: pool, lane, lease id, numbers
JOURNAL_ENTRY = 2 * KIB       # a journal entry waiting for journald: its fields and a job label
REDIS_LINKS = 8               # 2 per backend (commands, stream reader), 3 per Sentinel: 4 backends
BASE = 32 * MIB               # brokerd idle: 7-9 MiB RSS (tests/bench/README.md), with room
ROUND = 256 * MIB


def constant(root, path, name):
    with open(os.path.join(root, path)) as f:
        text = f.read()
    m = re.search(r"^#define " + name + r"\s+(.+?)\s*(?:/\*.*)?$", text, re.M)
    if not m:
        sys.exit(f"{name} not found in {path}")
    expr = re.sub(r"\((?:size_t|unsigned|uint64_t)\)", "", m.group(1))
    expr = re.sub(r"(\d+)U\b", r"\1", expr)
    if not re.fullmatch(r"[\d\s*()+]+", expr):
        sys.exit(f"{name} in {path}: cannot evaluate {m.group(1)!r}")
    return eval(expr)  # digits, spaces, *, + and parentheses only


def budget(root):
    conns = constant(root, "libbroker/conf.c", "DEFAULT_MAX_CONNECTIONS")
    message = constant(root, "libbroker/conf.c", "DEFAULT_MAX_MESSAGE_SIZE")
    output = constant(root, "libbroker/conf.c", "DEFAULT_MAX_OUTPUT_PER_CONNECTION")
    backlog = constant(root, "brokerd/history.h", "HISTORY_BACKLOG_MAX")
    job = constant(root, "brokerd/session.c", "JOB_MAX")
    block = constant(root, "brokerd/history-channel.c", "ROW_BLOCK_SIZE")
    spare = constant(root, "brokerd/history-channel.c", "ROW_BLOCKS_SPARE_MAX")
    journal = constant(root, "brokerd/journal.h", "JOURNAL_BACKLOG_MAX")
    # The largest reply a Redis link reads, and the bytes it may buffer unparsed beside it.
    reply = constant(root, "brokerd/redis-sdevent.h", "REDIS_REPLY_BYTES_MAX")
    return {
        "connections": conns * (PER_CONNECTION + message),
        "output": conns * output,
        "history": backlog * (job + ROW_OVERHEAD) + block * spare,
        "journal": journal * JOURNAL_ENTRY,
        "redis": REDIS_LINKS * reply,
        "base": BASE,
    }


def round_up(n):
    return math.ceil(n / ROUND) * ROUND


def unit_value(path, key):
    with open(path) as f:
        values = re.findall(r"^" + key + r"=(\d+)M\s*$", f.read(), re.M)
    if len(values) != 1:
        sys.exit(f"{path}: expected one {key}=NM, found {values}")
    return int(values[0]) * MIB


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    root = sys.argv[1]
    parts = budget(root)
    high = round_up(sum(v for k, v in parts.items() if k != "output"))
    top = round_up(sum(parts.values()))
    if "--print" in sys.argv[2:]:
        for k, v in parts.items():
            print(f"{k:12} {v / MIB:10.1f} MiB")
        print(f"MemoryHigh={high // MIB}M MemoryMax={top // MIB}M")
        return
    failed = False
    fdstore = constant(root, "libbroker/conf.c", "DEFAULT_MAX_CONNECTIONS") + 1
    for unit in ("units/brokerd.service.in", "units/user/brokerd.service.in"):
        with open(os.path.join(root, unit)) as f:
            values = re.findall(r"^FileDescriptorStoreMax=(\d+)\s*$", f.read(), re.M)
        if values != [str(fdstore)]:
            print(f"{unit}: FileDescriptorStoreMax={values}, but max-connections + the state memfd is {fdstore}")
            failed = True
        with open(os.path.join(root, unit)) as f:
            if re.search(r"^ProcSubset=pid\s*$", f.read(), re.M):
                print(f"{unit}: ProcSubset=pid hides the boot id the handover at a restart needs (brokerd(8) SANDBOXING)")
                failed = True
        for key, want in (("MemoryHigh", high), ("MemoryMax", top)):
            got = unit_value(os.path.join(root, unit), key)
            if got != want:
                print(f"{unit}: {key}={got // MIB}M, but the limits add up to {want // MIB}M "
                      f"(check-unit-memory.py {root} --print; brokerd(8) MEMORY)")
                failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
