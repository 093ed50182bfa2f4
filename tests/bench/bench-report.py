#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-report.py — slotctl report over large histories: wall time and peak RSS for each size, so that the
RSS staying flat as the rows grow shows that the report streams (issue 13: 1 million rows; 10 million for
bounded memory and time).

The history is synthetic but shaped like brokerd's: 2 pools, 3 lanes, a unique job label per request (the
"jobs refused most" grouping sees as many jobs as requests), 70% grants (a third of them after a wait) each
with its release, 30% refusals, over one week. Databases are made once per size under $TMPDIR and reused.

Usage: bench-report.py SLOTCTL [ROWS…]   (default: 100000 1000000)
A benchmark, not a test: it fails only when slotctl fails.
"""
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time

S = 1_000_000
T0 = 1_700_000_000 * S
WEEK = 7 * 24 * 3600 * S
GNU_TIME = "/usr/bin/time"


def make_history(path, rows):
    if os.path.exists(path):
        return
    rng = random.Random(rows)
    tmp = path + ".tmp"
    if os.path.exists(tmp):
        os.unlink(tmp)
    db = sqlite3.connect(tmp)
    db.executescript("""
        PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;
        PRAGMA application_id = 1397509972;
        CREATE TABLE events (id INTEGER PRIMARY KEY, time INTEGER NOT NULL, decision TEXT NOT NULL,
          pool TEXT, lane TEXT, job TEXT, lease TEXT, token INTEGER, wait_us INTEGER, hold_us INTEGER,
          budget_us INTEGER, idle_us INTEGER, state TEXT, uid INTEGER, pid INTEGER, retry_after_sec INTEGER,
          reason TEXT);
        CREATE TABLE leases (id TEXT PRIMARY KEY, pool TEXT NOT NULL, lane TEXT NOT NULL, slots TEXT NOT NULL,
          token INTEGER NOT NULL, job TEXT, uid INTEGER NOT NULL, pid INTEGER NOT NULL, command_pid INTEGER,
          command_start_time INTEGER, detached INTEGER NOT NULL, granted_at INTEGER NOT NULL, expires_at INTEGER,
          members TEXT);
        CREATE TABLE tokens (pool TEXT PRIMARY KEY, next_token INTEGER NOT NULL);
        CREATE TABLE alive (id INTEGER PRIMARY KEY CHECK (id = 1), at INTEGER NOT NULL);
        PRAGMA user_version = 4;""")
    pools, lanes = ("grid", "rigs"), ("merge", "nightly", "release")
    step = WEEK // rows
    batch, n, i = [], 0, 0
    while n < rows:
        t = T0 + n * step
        pool, lane, job = pools[i % 2], lanes[i % 3], f"https://ci.example/jobs/{i}"
        if rng.random() < 0.7 and n + 2 <= rows:
            wait = rng.randrange(1, 30 * S) if rng.random() < 0.33 else 0
            state = rng.choice(("keeping-up", "saturated")) if wait else None
            hold = rng.randrange(S, 600 * S)
            lease = f"{i:032x}"
            batch.append((t, "granted", pool, lane, job, lease, wait, None, state))
            batch.append((t + hold, "released", pool, lane, job, lease, None, hold, None))
            n += 2
        else:
            decision = rng.choice(("busy", "full", "timeout", "shed"))
            wait = rng.randrange(S, 60 * S) if decision in ("timeout", "shed") else 0
            batch.append((t, decision, pool, lane, job, None, wait, None, "saturated" if decision == "shed" else None))
            n += 1
        i += 1
        if len(batch) >= 100_000:
            db.executemany("INSERT INTO events (time, decision, pool, lane, job, lease, wait_us, hold_us, state) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", batch)
            batch.clear()
    db.executemany("INSERT INTO events (time, decision, pool, lane, job, lease, wait_us, hold_us, state) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", batch)
    # brokerd's indexes since schema 10 (brokerd/history-db.c: the unusual decisions, the spans of ids and
    # times); $BENCH_REPORT_OLD_INDEX=1: those before schema 9
    if os.environ.get("BENCH_REPORT_OLD_INDEX"):
        db.executescript("CREATE INDEX events_time ON events(time);"
                         "CREATE INDEX events_decision_time ON events(decision, time);")
    else:
        db.executescript("CREATE INDEX events_unusual_decision ON events(decision) "
                         "WHERE decision NOT IN ('granted', 'released');"
                         "CREATE TABLE event_spans (first_id INTEGER PRIMARY KEY, last_id INTEGER NOT NULL,"
                         "  min_time INTEGER NOT NULL, max_time INTEGER NOT NULL);"
                         "INSERT INTO event_spans SELECT min(id), max(id), min(time), max(time) FROM events "
                         "GROUP BY (id - 1) / 2048;")
    db.commit()
    db.close()
    os.rename(tmp, path)


def run(slotctl, history, out):
    """Wall time (s) and peak RSS (KiB) of one report. The RSS is GNU time's, which forks slotctl from a small
    process: a child forked from this python would inherit its resident pages into ru_maxrss (a high-water
    mark that exec does not reset)."""
    with tempfile.NamedTemporaryFile("r") as measure:
        argv = [slotctl, "report", "--history", history, "-o", out]
        if os.access(GNU_TIME, os.X_OK):
            argv = [GNU_TIME, "-q", "-f", "%e %M", "-o", measure.name] + argv
        start = time.monotonic()
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        elapsed = time.monotonic() - start
        if p.returncode != 0:
            sys.exit(f"bench-report: slotctl report exited {p.returncode}: {p.stderr}")
        fields = measure.read().split()
    return elapsed, int(fields[1]) if len(fields) == 2 else None


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    slotctl = os.path.abspath(sys.argv[1])
    sizes = [int(a) for a in sys.argv[2:]] or [100_000, 1_000_000]
    cache = os.path.join(tempfile.gettempdir(), "slotbroker-bench-report")
    os.makedirs(cache, exist_ok=True)
    print(f"bench-report: load average {os.getloadavg()[0]:.2f}")
    for rows in sizes:
        index = "old-index" if os.environ.get("BENCH_REPORT_OLD_INDEX") else "v10"
        history = os.path.join(cache, f"history-{index}-{rows}.db")
        t = time.monotonic()
        make_history(history, rows)
        made = time.monotonic() - t
        out = os.path.join(cache, f"report-{rows}.html")
        elapsed, rss = run(slotctl, history, out)
        peak = f"peak RSS {rss / 1024:.1f} MiB" if rss is not None else f"peak RSS unknown (no {GNU_TIME})"
        print(f"bench-report: {rows} rows ({os.path.getsize(history) / 2**20:.0f} MiB, made in {made:.1f} s): "
              f"{elapsed:.2f} s, {peak}, {rows / elapsed / 1e6:.2f} M rows/s, page {os.path.getsize(out) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
