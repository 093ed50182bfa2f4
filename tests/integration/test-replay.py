#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""slotctl simulate --replay: recorded requests from a history.db, built here with python's sqlite3 in
brokerd's schema, run against other pool settings.

Usage: test-replay.py SLOTCTL
"""
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import unittest

SLOTCTL = None
T0 = 1_700_000_000 * 1_000_000  # µs, realtime
MS = 1000
S = 1_000_000

# history.db as brokerd writes it (schema version 2: migration 1's tables, events.reason from 2).
SCHEMA = """
PRAGMA application_id = 1397509972;
CREATE TABLE events (
  id INTEGER PRIMARY KEY, time INTEGER NOT NULL, decision TEXT NOT NULL,
  pool TEXT, lane TEXT, job TEXT, lease TEXT, token INTEGER,
  wait_us INTEGER, hold_us INTEGER, budget_us INTEGER, idle_us INTEGER,
  state TEXT, uid INTEGER, pid INTEGER, retry_after_sec INTEGER, reason TEXT);
CREATE INDEX events_time ON events(time);
CREATE INDEX events_decision_time ON events(decision, time);
CREATE TABLE leases (id TEXT PRIMARY KEY, pool TEXT NOT NULL, lane TEXT NOT NULL, slots TEXT NOT NULL,
  token INTEGER NOT NULL, job TEXT, uid INTEGER NOT NULL, pid INTEGER NOT NULL, command_pid INTEGER,
  command_start_time INTEGER, detached INTEGER NOT NULL, granted_at INTEGER NOT NULL, expires_at INTEGER);
CREATE TABLE tokens (pool TEXT PRIMARY KEY, next_token INTEGER NOT NULL);
PRAGMA user_version = 2;
"""

# Schema 5: leases.members (3), the alive table (4), events.selector (5), which the replay reads.
SCHEMA_5 = (SCHEMA.replace("retry_after_sec INTEGER, reason TEXT);", "retry_after_sec INTEGER, reason TEXT, selector TEXT);")
            .replace("granted_at INTEGER NOT NULL, expires_at INTEGER);",
                     "granted_at INTEGER NOT NULL, expires_at INTEGER, members TEXT);")
            .replace("PRAGMA user_version = 2;",
                     "CREATE TABLE alive (id INTEGER PRIMARY KEY CHECK (id = 1), at INTEGER NOT NULL);\n"
                     "PRAGMA user_version = 5;"))

# Schema 7: events.member, events.exit_status (6), events.slots (7): how many slots each request asked for.
SCHEMA_7 = (SCHEMA_5.replace("reason TEXT, selector TEXT);",
                             "reason TEXT, selector TEXT, member TEXT, exit_status INTEGER, slots INTEGER);")
            .replace("PRAGMA user_version = 5;", "PRAGMA user_version = 7;"))

# The configuration the labelled history below was recorded with (brokerd.conf(5)).
RIGS_CONFIG = """\
[pool rigs]
members = a b c d
label.arm64 = a b
label.usb3 = b c

[lane w]
pools = rigs
policy = wait

[lane ff]
pools = rigs
policy = fail-fast

[lane arm]
pools = rigs
policy = fail-fast
labels = arm64
"""


class History:
    """Writes decisions as brokerd's audit would: a grant, and later its lease's end."""

    def __init__(self, path, schema=SCHEMA):
        self.db = sqlite3.connect(path)
        self.db.executescript(schema)
        self.leases = 0

    def add(self, t_us, decision, pool, lane, **kw):
        cols = {"time": T0 + t_us, "decision": decision, "pool": pool, "lane": lane, "uid": 1000, "pid": 4242, **kw}
        self.db.execute(f"INSERT INTO events ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                        list(cols.values()))

    def grant(self, at_us, pool, lane, hold_us, wait_us=0, budget_us=None, state=None, end="released", **kw):
        """A request that arrived at at_us, was granted after wait_us and held hold_us (None: not ended)."""
        self.leases += 1
        lease = f"lease{self.leases:028d}"
        self.add(at_us + wait_us, "granted", pool, lane, lease=lease, token=self.leases, wait_us=wait_us,
                 budget_us=budget_us, state=state, **kw)
        if hold_us is not None:
            self.add(at_us + wait_us + hold_us, end, pool, lane, lease=lease, token=self.leases, hold_us=hold_us)

    def refuse(self, at_us, decision, pool, lane, wait_us=0, budget_us=None, state=None, **kw):
        self.add(at_us + wait_us, decision, pool, lane, wait_us=wait_us, budget_us=budget_us, state=state,
                 retry_after_sec=7, **kw)

    def close(self):
        self.db.commit()
        self.db.close()


def simulate(*args, check=True):
    p = subprocess.run([SLOTCTL, "simulate", *args], capture_output=True, text=True, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError(f"slotctl simulate {' '.join(args)} exited {p.returncode}: {p.stderr}")
    return p


def simulate_json(*args):
    return json.loads(simulate(*args, "--json").stdout)


class Replay(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "history.db")

    def tearDown(self):
        self.dir.cleanup()

    def fail_fast_history(self, schema=SCHEMA):
        """The merge lane fails fast on a pool of 6: 12 requests 100 ms apart, each holding 10 s; the
        first 6 were granted, the next 6 refused busy."""
        h = History(self.path, schema)
        for i in range(12):
            if i < 6:
                h.grant(i * 100 * MS, "grid", "merge", 10 * S)
            else:
                h.refuse(i * 100 * MS, "busy", "grid", "merge")
        h.close()

    def test_limits_change_the_refusals(self):
        self.fail_fast_history()
        p = simulate("--replay", self.path, "--json")
        recorded = json.loads(p.stdout)
        self.assertEqual(recorded["requests"], 12)
        # The recorded pool: limit 6, the most held at once; merge failed fast.
        self.assertEqual(recorded["refused"]["busy"], 6)
        self.assertIn("limit 6: the most slots held at once", p.stderr)
        self.assertIn("merge (fail-fast)", p.stderr)
        self.assertIn("6 refused requests hold their lane's median hold", p.stderr)
        self.assertEqual(recorded["perRequest"], [])
        # No recorded client went away: nothing is cancelled (every request was, at its arrival, "cancelled 12").
        self.assertNotIn("cancelled", recorded)
        self.assertNotIn("cancelled", simulate("--replay", self.path).stdout)

        smaller = simulate_json("--replay", self.path, "--limit", "4")
        larger = simulate_json("--replay", self.path, "--limit", "10")
        self.assertEqual((smaller["granted"], smaller["refused"]["busy"]), (4, 8))
        self.assertEqual((larger["granted"], larger["refused"]["busy"]), (10, 2))

    def test_sweep(self):
        self.fail_fast_history()
        rows = simulate_json("--replay", self.path, "--sweep", "limit=4..8")
        self.assertEqual([r["value"] for r in rows], [4, 5, 6, 7, 8])
        self.assertEqual([r["busy"] for r in rows], [8, 7, 6, 5, 4])
        # slotctl(1)'s own form; the swept setting is the sweep's, not inferred from the history (which
        # would say "limit 6: the most slots held at once" and, with no grant to infer it from, refuse).
        p = simulate("--replay", self.path, "--sweep", "limit=4..8")
        self.assertIn("limit", p.stdout.splitlines()[0])
        self.assertEqual(len(p.stdout.splitlines()), 6)
        self.assertNotIn("the most slots held at once", p.stderr)
        self.assertIn("merge (fail-fast)", p.stderr)

    def test_a_replay_past_the_simulators_bounds(self):
        """Two leases held 200 days at once: at limit 1 the second waits 200 days and holds 200 more, past the
        366 days a run covers. simulate says so (exit 64); report --replay-sweep says so on the page, as for a
        pool it cannot model, instead of failing the whole report with "Argument list too long"."""
        h = History(self.path)
        for _ in range(2):
            h.grant(0, "grid", "w", 200 * 86400 * S)
        h.close()
        p = simulate("--replay", self.path, "--sweep", "limit=1..2", check=False)
        self.assertEqual(p.returncode, 64, p.stderr)
        self.assertIn("runs past 366d of virtual time", p.stderr)

        page = os.path.join(self.dir.name, "report.html")
        p = subprocess.run([SLOTCTL, "report", "--history", self.path, "-o", page, "--replay-sweep", "limit=1..2"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(page) as f:
            text = f.read()
        self.assertIn("could not be replayed: limit=1: the simulation runs past 366d of virtual time", text)

    def test_arrival_is_time_minus_wait_and_refused_borrow_the_median_hold(self):
        # Pool rig, limit 1, Q = 2 s, lane nightly waits. A arrives at 0 and holds 5 s. B arrives at 1 s,
        # waits its 2 s budget and is refused at 3 s (recorded at 3 s with wait 2 s). C arrives at 5.5 s
        # and holds 1 s. A second pool keeps --pool necessary.
        h = History(self.path)
        h.grant(0, "rig", "nightly", 5 * S)
        h.refuse(1 * S, "timeout", "rig", "nightly", wait_us=2 * S, budget_us=2 * S, state="keeping-up")
        h.grant(5500 * MS, "rig", "nightly", 1 * S)
        h.grant(0, "grid", "merge", 1 * S)
        h.close()

        p = simulate("--replay", self.path, check=False)
        self.assertEqual(p.returncode, 64)
        self.assertIn("several pools", p.stderr)
        self.assertIn("grid (1)", p.stderr)
        self.assertIn("rig (3)", p.stderr)

        # Recorded settings: limit 1 (inferred), Q 2 s (the keeping-up budget). B arrived at 1 s, not at
        # 3 s: it waits for A until 5 s, longer than Q, as recorded.
        p = simulate("--replay", self.path, "--pool", "rig", "--json", "--per-request")
        r = json.loads(p.stdout)
        self.assertIn("queue-timeout 2s", p.stderr)
        self.assertIn("nightly (wait)", p.stderr)
        self.assertEqual(r["requests"], 3)
        self.assertEqual(r["refused"]["timeout"], 1)
        b = [x for x in r["perRequest"] if x["arrivedMs"] == 1000]
        self.assertEqual(len(b), 1)
        self.assertEqual(b[0]["outcome"], "timeout")
        self.assertEqual(b[0]["decidedMs"], 3000)

        # A budget of 3 s is still too short for a wait of 4 s; one of 5 s is not. Had the replay put B's
        # arrival at 3 s, both would grant it.
        p = simulate("--replay", self.path, "--pool", "rig", "--sweep", "queue-timeout=3..5", "--json")
        self.assertNotIn("queue-timeout 2s", p.stderr)
        self.assertEqual([row["timeout"] for row in json.loads(p.stdout)], [1, 0, 0])  # 4 s: granted as its budget ends
        r = simulate_json("--replay", self.path, "--pool", "rig", "--queue-timeout", "3s")
        self.assertEqual(r["refused"]["timeout"], 1)
        r = simulate_json("--replay", self.path, "--pool", "rig", "--queue-timeout", "5s", "--per-request")
        self.assertEqual(r["refused"]["timeout"], 0)
        b = [x for x in r["perRequest"] if x["arrivedMs"] == 1000][0]
        self.assertEqual((b["outcome"], b["waitedMs"]), ("granted", 4000))

        # With two slots B is granted at once and holds the lower median of its lane's holds (1 s, of
        # 5 s and 1 s): everything has drained 1 s after C's arrival at 5.5 s, C holding 1 s too.
        r = simulate_json("--replay", self.path, "--pool", "rig", "--limit", "2")
        self.assertEqual(r["granted"], 3)
        self.assertEqual(r["drainedMs"], 1000)

    def test_open_lease_holds_until_the_history_ends(self):
        h = History(self.path)
        h.grant(0, "grid", "merge", None)           # never released
        h.grant(1 * S, "grid", "merge", 1 * S)      # the last event is its release at 2 s
        h.refuse(1500 * MS, "busy", "grid", "merge")
        h.close()
        p = simulate("--replay", self.path, "--json")
        r = json.loads(p.stdout)
        self.assertIn("1 grants had not ended by the last event", p.stderr)
        self.assertIn("limit 2", p.stderr)
        self.assertEqual((r["granted"], r["refused"]["busy"]), (2, 1))

    def test_bad_input(self):
        p = simulate("--replay", os.path.join(self.dir.name, "missing.db"), check=False)
        self.assertEqual(p.returncode, 64)
        self.assertIn("cannot read", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir.name, "missing.db")))  # never created

        with open(self.path, "wb") as f:
            f.write(os.urandom(8192))
        p = simulate("--replay", self.path, check=False)
        self.assertEqual(p.returncode, 64)

        os.unlink(self.path)
        db = sqlite3.connect(self.path)
        db.execute("CREATE TABLE recipes (name TEXT)")
        db.close()
        p = simulate("--replay", self.path, check=False)
        self.assertEqual(p.returncode, 64)
        self.assertIn("not a brokerd history database", p.stderr)

        os.unlink(self.path)
        History(self.path).close()
        p = simulate("--replay", self.path, check=False)
        self.assertEqual(p.returncode, 64)
        self.assertIn("holds no requests", p.stderr)

        self.fail_fast_history_at(os.path.join(self.dir.name, "h2.db"))
        for extra, message in ((["--scenario", "x.json"], "cannot be combined with --scenario"),
                               (["--arrivals", "1/s:1s"], "cannot be combined with --arrivals"),
                               (["--pool", "nonesuch"], "has no requests for pool 'nonesuch'")):
            p = simulate("--replay", os.path.join(self.dir.name, "h2.db"), *extra, check=False)
            self.assertEqual(p.returncode, 64, extra)
            self.assertIn(message, p.stderr)
        p = simulate("--pool", "grid", "--limit", "1", "--hold", "1s", "--arrivals", "1/s:1s", check=False)
        self.assertEqual(p.returncode, 64)
        self.assertIn("--pool needs --replay", p.stderr)

    def test_another_programs_database_is_refused(self):
        # Tables just like brokerd's, but not brokerd's file: its application_id says whose it is.
        for app_id in (0, 0x12345678):
            with self.subTest(application_id=app_id):
                if os.path.exists(self.path):
                    os.unlink(self.path)
                self.fail_fast_history(SCHEMA.replace("application_id = 1397509972", f"application_id = {app_id}"))
                p = simulate("--replay", self.path, check=False)
                self.assertEqual(p.returncode, 64, p.stderr)
                self.assertIn(f"'{self.path}' is not a brokerd history database", p.stderr)
                self.assertEqual(p.stdout, "")

    def test_a_newer_schema_is_refused(self):
        self.fail_fast_history(SCHEMA.replace("user_version = 2", "user_version = 1000"))
        p = simulate("--replay", self.path, check=False)
        self.assertEqual(p.returncode, 64, p.stderr)
        self.assertIn("newer brokerd (schema version 1000", p.stderr)
        self.assertEqual(p.stdout, "")

    def test_an_older_schema_is_read(self):
        # Version 1 had no events.reason, which the replay does not read.
        self.fail_fast_history(SCHEMA.replace(", reason TEXT", "").replace("user_version = 2", "user_version = 1"))
        r = simulate_json("--replay", self.path)
        self.assertEqual((r["requests"], r["granted"], r["refused"]["busy"]), (12, 6, 6))

    def test_slot_counts_are_replayed(self):
        # Schema 7 records each request's slots: three grants of 2 slots held 10 s (6 slots at once, the
        # inferred limit), then two refused requests of 2 and one of 1 (fail-fast: no room).
        h = History(self.path, SCHEMA_7)
        for i in range(3):
            h.grant(i * 100 * MS, "grid", "merge", 10 * S, slots=2)
        h.refuse(300 * MS, "busy", "grid", "merge", slots=2)
        h.refuse(400 * MS, "busy", "grid", "merge", slots=2)
        h.refuse(500 * MS, "busy", "grid", "merge", slots=1)
        h.close()
        p = simulate("--replay", self.path, "--json")
        recorded = json.loads(p.stdout)
        self.assertIn("limit 6: the most slots held at once", p.stderr)
        self.assertEqual((recorded["granted"], recorded["refused"]["busy"]), (3, 3))
        # Seven slots take the 1-slot request too; eight a 2-slot one, not both (one slot asked each would
        # have granted everything from a limit of 6 on).
        seven = simulate_json("--replay", self.path, "--limit", "7")
        eight = simulate_json("--replay", self.path, "--limit", "8")
        self.assertEqual((seven["granted"], seven["refused"]["busy"]), (4, 2))
        self.assertEqual((eight["granted"], eight["refused"]["busy"]), (4, 2))
        self.assertEqual(simulate_json("--replay", self.path, "--limit", "9")["granted"], 5)
        # A count no brokerd writes is refused, naming its event.
        db = sqlite3.connect(self.path)
        db.execute("UPDATE events SET slots = 0 WHERE decision = 'busy' AND slots = 1")
        db.commit()
        db.close()
        p = simulate("--replay", self.path, check=False)
        self.assertEqual(p.returncode, 64, p.stderr)
        self.assertRegex(p.stderr, r"event \d+: invalid slot count 0")

    def labelled_history(self):
        """Rigs a b c d (arm64 = a b, usb3 = b c), every lease held 10 s unless said. Which requests were
        granted depends on which members they could use: 4 requests on 4 rigs, and still 2 refused.
        Returns {event id: (decision, wait_us)} of the requests, in event order."""
        h = History(self.path, SCHEMA_5)
        h.grant(0, "rigs", "w", 10 * S, selector="@a")                         # a
        h.grant(100 * MS, "rigs", "arm", 10 * S)                               # b: the lane's arm64
        h.refuse(200 * MS, "busy", "rigs", "ff", selector="arm64")             # a and b held: c, d no use
        h.grant(300 * MS, "rigs", "ff", 10 * S, selector="!arm64 usb3")        # c
        h.refuse(400 * MS, "busy", "rigs", "ff", selector="usb3")              # b and c held; d is free
        h.grant(500 * MS, "rigs", "ff", 2 * S)                                 # d
        # Waits for usb3 (b or c: both until 10.1 s) while d frees at 2.5 s: it is no use.
        h.grant(1 * S, "rigs", "w", 1 * S, wait_us=9100 * MS, selector="usb3")
        h.close()
        db = sqlite3.connect(self.path)
        rows = db.execute("SELECT id, decision, wait_us FROM events WHERE decision IN ('granted', 'busy') "
                          "ORDER BY id").fetchall()
        db.close()
        return {f"e{i}": (d, w or 0) for i, d, w in rows}

    def test_selectors_are_replayed(self):
        recorded = self.labelled_history()
        config = os.path.join(self.dir.name, "brokerd.conf")
        with open(config, "w") as f:
            f.write(RIGS_CONFIG)

        # The same members and labels: the same grants and refusals, and the same wait.
        p = simulate("--replay", self.path, "--config", config, "--json", "--per-request")
        r = json.loads(p.stdout)
        self.assertIn("4 members with their labels", p.stderr)
        self.assertIn("5 requests asked for labels or a member", p.stderr)
        self.assertNotIn("the most slots held at once", p.stderr)  # a member pool's limit is its members
        got = {x["name"]: (x["outcome"], (x.get("waitedMs") or 0) * MS) for x in r["perRequest"]}
        self.assertEqual(got, recorded)

        # The selectors cannot be replayed without the members and labels they name: said, not ignored.
        p = simulate("--replay", self.path, check=False)
        self.assertEqual(p.returncode, 64)
        self.assertIn("5 requests of pool 'rigs'", p.stderr)
        self.assertIn("--config", p.stderr)
        self.assertEqual(p.stdout, "")

        # A relabelled configuration replays the history against the new labels: d carries arm64 now,
        # so the arm64 request of 0.2 s takes it, and the one asking for nothing in particular at 0.5 s
        # finds every rig held.
        with open(config, "w") as f:
            f.write(RIGS_CONFIG.replace("label.arm64 = a b", "label.arm64 = a b d"))
        r = simulate_json("--replay", self.path, "--config", config, "--per-request")
        got = {x["name"]: x["outcome"] for x in r["perRequest"]}
        self.assertEqual(got[list(recorded)[2]], "granted")
        self.assertEqual(got[list(recorded)[5]], "busy")

    def test_cooldown_from_the_config_is_replayed(self):
        h = History(self.path, SCHEMA_5)
        h.grant(0, "lic", "w", 1 * S)          # the seat rests 1 s → 6 s under cooldown = 5s
        h.grant(2 * S, "lic", "w", 1 * S)      # recorded without a wait
        h.close()
        config = os.path.join(self.dir.name, "brokerd.conf")
        with open(config, "w") as f:
            f.write("[pool lic]\nlimit = 1\ncooldown = 5s\n\n[lane w]\npools = lic\n")
        p = simulate("--replay", self.path, "--config", config, "--json", "--per-request")
        self.assertIn("cooldown 5s from --config", p.stderr)
        waits = [x.get("waitedMs") for x in json.loads(p.stdout)["perRequest"]]
        self.assertEqual(waits, [0, 4000])     # the second waits for the seat to wake, as brokerd would
        waits = [x.get("waitedMs") for x in simulate_json("--replay", self.path, "--per-request")["perRequest"]]
        self.assertEqual(waits, [0, 0])        # without --config, nothing rests

    def test_exit_statuses_quarantine_and_restore_as_the_config_says(self):
        # Schema 6's events.exit_status: what each release's command told. With --config's
        # quarantine-exit-codes= and health lane, the replay quarantines a after its exit 3, the health job's
        # exit 1 keeps it so and its exit 0 restores it: the ordinary request recorded at 2 s waits until then.
        h = History(self.path, SCHEMA_7)
        for lease, (at, lane, hold, status) in enumerate(((0, "w", S, 3), (2 * S, "w", S, 0),
                                                          (int(2.2 * S), "health", S // 2, 1),
                                                          (3 * S, "health", S // 2, 0)), 1):
            h.add(at, "granted", "rigs", lane, lease=f"l{lease}", token=lease, wait_us=0)
            h.add(at + hold, "released", "rigs", lane, lease=f"l{lease}", token=lease, hold_us=hold,
                  exit_status=status)
        h.close()
        config = os.path.join(self.dir.name, "brokerd.conf")
        with open(config, "w") as f:
            f.write("[pool rigs]\nmembers = a\nquarantine-exit-codes = 3\n\n[lane w]\npools = rigs\n\n"
                    "[lane health]\npools = rigs\nhealth = yes\n")
        p = simulate("--replay", self.path, "--config", config, "--json", "--per-request")
        self.assertIn("recorded exit statuses quarantine and restore", p.stderr)
        r = json.loads(p.stdout)
        self.assertEqual((r["quarantined"], r["restored"]), (1, 1))
        self.assertEqual([x["waitedMs"] for x in r["perRequest"]], [0, 1500, 0, 0])
        # Without --config's quarantine-exit-codes=, the statuses change nothing.
        with open(config, "w") as f:
            f.write("[pool rigs]\nmembers = a\n\n[lane w]\npools = rigs\n\n[lane health]\npools = rigs\n")
        r = simulate_json("--replay", self.path, "--config", config, "--per-request")
        self.assertNotIn("quarantined", r)
        self.assertEqual([x["waitedMs"] for x in r["perRequest"]], [0, 0, 800, 500])

    def test_reservations_are_replayed_as_reservations(self):
        # brokerd records a `slotctl reserve` as a request of lane "@reserve" (one slot, its reason as the job,
        # its member or labels as its selector), held until its --for ran out (revoked, max-hold) or it was
        # released. The replay submits it as a reservation again, ahead of every waiting job: here one that
        # arrived at 0.9 s takes the slot freed at 1 s before the job waiting since 0.8 s, which waits until
        # the reservation's 2 s are over.
        h = History(self.path, SCHEMA_7)
        h.grant(0, "grid", "w", 1 * S, job="build-1")
        h.grant(int(0.9 * S), "grid", "@reserve", 2 * S, wait_us=int(0.1 * S), end="revoked",
                job="debugging the flaky hub", reason="max-hold")
        h.grant(int(0.8 * S), "grid", "w", S // 2, wait_us=int(2.2 * S), job="build-2")
        h.close()
        p = simulate("--replay", self.path, "--limit", "1", "--json", "--per-request")
        r = json.loads(p.stdout)
        self.assertIn("1 reservation", p.stderr)
        self.assertNotIn("@reserve", p.stderr)  # no lane of that name
        self.assertEqual(r["requests"], 2)
        self.assertEqual(r["reservations"], {"count": 1, "granted": 1, "refused": 0, "longestWaitMs": 100})
        self.assertEqual([x["waitedMs"] for x in r["perRequest"]], [0, 2200])

        # A reservation for a member asks for it again (the member from --config, as any selector).
        h = History(self.path + "2", SCHEMA_7)
        h.grant(0, "rigs", "@reserve", 1 * S, selector="@b", job="look at b")
        h.grant(int(0.5 * S), "rigs", "w", S // 2, job="build", selector="@b", wait_us=S // 2)
        h.close()
        config = os.path.join(self.dir.name, "brokerd.conf")
        with open(config, "w") as f:
            f.write("[pool rigs]\nmembers = a b\n\n[lane w]\npools = rigs\n")
        r = simulate_json("--replay", self.path + "2", "--config", config, "--per-request")
        self.assertEqual(r["reservations"]["granted"], 1)
        self.assertEqual([x["waitedMs"] for x in r["perRequest"]], [500])

    def test_selectors_bad_input(self):
        self.labelled_history()
        config = os.path.join(self.dir.name, "brokerd.conf")
        with open(config, "w") as f:
            f.write(RIGS_CONFIG)
        for text, message in (("[pool rigs]\nmembers = a\nlabel.arm64 = z\n", "not a member of pool rigs"),
                              ("[pool grid]\nlimit = 2\n", "has no pool 'rigs'"),
                              ("[pool rigs]\nlimit = 4\n", "asked for labels or a member")):
            with self.subTest(config=text):
                with open(config, "w") as f:
                    f.write(text + "[lane x]\npools = " + text.split()[1].rstrip("]") + "\n")
                p = simulate("--replay", self.path, "--config", config, check=False)
                self.assertEqual(p.returncode, 64, p.stderr)
                self.assertIn(message, p.stderr)
                self.assertEqual(p.stdout, "")
        p = simulate("--replay", self.path, "--config", os.path.join(self.dir.name, "missing.conf"), check=False)
        self.assertEqual(p.returncode, 64, p.stderr)
        p = simulate("--limit", "1", "--hold", "1s", "--arrivals", "1/s:1s", "--config", config, check=False)
        self.assertEqual(p.returncode, 64)
        self.assertIn("--config needs --replay", p.stderr)

        # A member the configuration does not have: the request that names it is named.
        with open(config, "w") as f:
            f.write(RIGS_CONFIG.replace("members = a b c d", "members = b c d").replace("= a b", "= b"))
        p = simulate("--replay", self.path, "--config", config, check=False)
        self.assertEqual(p.returncode, 64, p.stderr)
        self.assertIn("event 1", p.stderr)

        # history.db is untrusted: a selector no brokerd writes is an error naming its event.
        with open(config, "w") as f:
            f.write(RIGS_CONFIG)
        for bad in ("Arm64", "@a @b", "@", "!", "a\tb", "x" * 100, " ".join(["l"] * 65), "@../etc"):
            with self.subTest(selector=bad):
                db = sqlite3.connect(self.path)
                db.execute("UPDATE events SET selector = ? WHERE id = 3", (bad,))
                db.commit()
                db.close()
                p = simulate("--replay", self.path, "--config", config, check=False)
                self.assertEqual(p.returncode, 64, p.stderr)
                self.assertIn("event 3: invalid selector", p.stderr)

    def test_names_no_brokerd_writes_never_reach_the_terminal(self):
        """history.db is untrusted: a lane, pool or selector with escape sequences, a newline or a right-to-left
        override is refused or left out, and never printed raw (the lanes line printed them, ESC included)."""
        evil = "x\x1b]0;owned\x07\x1b[2J\r\nforged line\u202e\u009b"
        unsafe = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
        self.fail_fast_history()
        db = sqlite3.connect(self.path)
        db.execute("UPDATE events SET lane = ? WHERE id = 3", (evil,))
        db.commit()
        db.close()
        p = simulate("--replay", self.path, check=False)
        self.assertEqual(p.returncode, 64, p.stderr)
        self.assertIn("event 3: invalid lane name", p.stderr)
        self.assertNotRegex(p.stderr, unsafe)
        self.assertNotIn("forged line", p.stderr.replace("\\n", ""))

        os.unlink(self.path)
        self.fail_fast_history()
        db = sqlite3.connect(self.path)
        db.execute("INSERT INTO events (time, decision, pool, lane, lease, wait_us) VALUES (?, 'granted', ?, 'merge', 'l', 0)",
                   (T0, evil))
        db.commit()
        db.close()
        p = simulate("--replay", self.path, check=False)
        self.assertNotRegex(p.stderr, unsafe)
        self.assertEqual(p.returncode, 0, p.stderr)  # the one pool a brokerd could have written
        self.assertNotIn("forged", p.stderr)

        os.unlink(self.path)
        h = History(self.path, SCHEMA_5)
        h.grant(0, "rigs", "w", S, selector=evil)
        h.close()
        config = os.path.join(self.dir.name, "brokerd.conf")
        with open(config, "w") as f:
            f.write(RIGS_CONFIG)
        p = simulate("--replay", self.path, "--config", config, check=False)
        self.assertEqual(p.returncode, 64, p.stderr)
        self.assertIn("event 1: invalid selector", p.stderr)
        self.assertNotRegex(p.stderr, unsafe)

    def fail_fast_history_at(self, path):
        saved, self.path = self.path, path
        try:
            self.fail_fast_history()
        finally:
            self.path = saved


if __name__ == "__main__":
    SLOTCTL = os.path.abspath(sys.argv[1])
    unittest.main(argv=[sys.argv[0], "-v"])
