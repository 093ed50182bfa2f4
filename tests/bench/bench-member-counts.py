#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-member-counts.py — where a restart finds the per-member counts (issue 23 item 7: the metrics
slotbroker_member_grants_total, _held_seconds_total, _quarantines_total and the count towards quarantine-after
go on across a restart). Two ways, timed side by side in one run:

- rebuilt from history.db: the query a start would run over the events rows that carry a member (schema 6),
  over a synthetic history of ROWS rows (64 rigs, 70% grants each with its release, 1% quarantines, one week);
  python's sqlite3 is the same SQLite library brokerd links;
- read from the lease log: brokerd's start with a leases.log of MEMBERS "use" records (one per member,
  whatever the history's size), from exec to its first Status answer, against the same start with none.

Usage: bench-member-counts.py BROKERD [ROWS [MEMBERS]]   (default: 1000000 10000)
A benchmark, not a test: it fails only when brokerd fails.
"""
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
import zlib

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchbrokerd  # noqa: E402

S = 1_000_000
T0 = 1_700_000_000 * S
WEEK = 7 * 24 * 3600 * S
RIGS = [f"rig-{i}" for i in range(64)]


def make_history(path, rows):
    if os.path.exists(path):
        return
    rng = random.Random(rows)
    db = sqlite3.connect(path + ".tmp")
    db.executescript("""
        PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;
        CREATE TABLE events (id INTEGER PRIMARY KEY, time INTEGER NOT NULL, decision TEXT NOT NULL,
          pool TEXT, lane TEXT, lease TEXT, hold_us INTEGER, member TEXT, exit_status INTEGER);
        CREATE INDEX events_time ON events(time);
        CREATE INDEX events_decision_time ON events(decision, time);""")
    step, batch, n, i = WEEK // rows, [], 0, 0
    while n < rows:
        t, member = T0 + n * step, RIGS[i % len(RIGS)]
        if rng.random() < 0.7 and n + 2 <= rows:
            hold, lease = rng.randrange(S, 600 * S), f"{i:032x}"
            batch.append((t, "granted", "rigs", "w", lease, None, member, None))
            batch.append((t + hold, "released", "rigs", "w", lease, hold, member, rng.choice((0, 0, 1, 3))))
            n += 2
        elif rng.random() < 0.03:
            batch.append((t, "quarantined", "rigs", None, None, None, member, 3))
            n += 1
        else:
            batch.append((t, "busy", "rigs", "w", None, None, None, None))
            n += 1
        i += 1
        if len(batch) >= 100_000:
            db.executemany("INSERT INTO events (time, decision, pool, lane, lease, hold_us, member, exit_status) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", batch)
            batch.clear()
    db.executemany("INSERT INTO events (time, decision, pool, lane, lease, hold_us, member, exit_status) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", batch)
    db.commit()
    db.close()
    os.rename(path + ".tmp", path)


def rebuild_from_history(path):
    """The counts as a start would rebuild them (grants, held µs, quarantines per member; the failures in a row
    would need each member's rows in order on top). Returns (seconds, members)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    start = time.monotonic()
    rows = db.execute("SELECT pool, member, sum(decision = 'granted'), sum(CASE WHEN decision = 'released' "
                      "THEN hold_us END), sum(decision = 'quarantined') FROM events WHERE decision IN "
                      "('granted', 'released', 'quarantined') AND member IS NOT NULL GROUP BY pool, member").fetchall()
    elapsed = time.monotonic() - start
    db.close()
    return elapsed, len(rows)


def line(obj):
    text = json.dumps(obj, separators=(",", ":"))
    return f"{zlib.crc32(text.encode()):08x} {text}\n"


def start_brokerd(brokerd, work, members):
    """Seconds from exec to the first Status answer, with a lease log of `members` use records."""
    state, sock = os.path.join(work, f"state-{members}"), os.path.join(work, f"sock-{members}")
    os.makedirs(state, exist_ok=True)
    with open(os.path.join(state, "leases.log"), "w") as f:
        f.write(line({"slotbroker": "leases", "version": 1}))
        for k in range(members):
            f.write(line({"use": {"pool": "rigs", "member": RIGS[k % len(RIGS)] if k < len(RIGS) else f"old-{k}",
                                  "grants": 1000 + k, "heldUs": 3600 * S, "quarantines": 2, "failures": 1}}))
    conf = os.path.join(work, "brokerd.conf")
    with open(conf, "w") as f:
        f.write(f"[pool rigs]\nmembers = {' '.join(RIGS)}\nquarantine-exit-codes = 3\n\n[lane w]\npools = rigs\n")
    with benchbrokerd.started(brokerd, conf, sock, state) as (_, ready):
        return ready


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    brokerd = sys.argv[1]
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
    members = int(sys.argv[3]) if len(sys.argv) > 3 else 10_000
    path = os.path.join(tempfile.gettempdir(), f"bench-member-counts-{rows}.db")
    make_history(path, rows)
    print(f"load average: {os.getloadavg()[0]:.2f}")
    for _ in range(2):
        secs, n = rebuild_from_history(path)
        print(f"rebuilt from history.db ({rows} rows, {n} members): {secs * 1000:.1f} ms")
    with tempfile.TemporaryDirectory() as work:
        for _ in range(2):
            base = start_brokerd(brokerd, work, 0)
            with_uses = start_brokerd(brokerd, work, members)
            print(f"brokerd start to first Status: no use records {base * 1000:.1f} ms, "
                  f"{members} use records {with_uses * 1000:.1f} ms")


if __name__ == "__main__":
    main()
