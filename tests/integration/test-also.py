#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""All or nothing over several pools (`also = POOL[:K]…`, SPEC §3.5, issue 22 item 4) through the real brokerd
and `slotctl run`, witnessed by the commands (witness.py): each takes a lock file per slot of every pool of
its set, and one that finds a pool of its set missing from its environment is a set held in part.

Pools grid (2), db (1), lic (members l1 l2 l3); lane e2e = grid + db + lic:2.
- A grant carries every pool's slots and tokens; the command sees SLOT_DB_TOKEN/_INDEX and
  SLOT_LIC_TOKEN/_INDEX/_MEMBER beside the chosen pool's variables; a nested run does not inherit them.
- While db is held, an e2e request waits holding nothing (grid and lic stay free); a db request behind it
  waits behind it; when db frees, the set gets it, not the one-pool request.
- Status lists the set's lease under each pool (slotctl status), and the history has a row per pool with
  the lease id.
- A fail-fast set with db taken is refused busy, naming db.
- The lease log carries the set across a restart of brokerd: after it, db and the licences stay held.
- `brokerd --check-config` shows also= and refuses a set naming the lane's own pool, an unknown pool, K
  above a pool's limit, a shared pool among local ones, a pool twice (file:line, key, the lane).
- A waiting set handed over through the fd store keeps its place: the one-pool waiter behind it in db
  still does not get db first. One whose lane's also= changed across the restart is refused as after a
  reload ("reload"), not granted without the pools it was queued for.
- history.db (schema 7) records the slots each request asked of each pool: the set's rows, a refusal
  naming db, a one-pool request.

Usage: test-also.py BROKERD SLOTCTL [unittest arguments]
"""
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
import harness  # noqa: E402
from harness import wait_for  # noqa: E402
from witness import Witness  # noqa: E402

SLOTCTL = None
EX_TEMPFAIL = 75

CONFIG = """\
[broker]
reclaim-grace = 60s

[pool grid]
limit = 2

[pool db]
limit = 1

[pool lic]
members = l1 l2 l3

[lane e2e]
pools = grid
also = db lic:2
policy = wait

[lane ff]
pools = grid
also = db
policy = fail-fast

[lane db]
pools = db
policy = wait
"""

ALSO = ("db", "lic")


class Also(harness.BrokerTestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="also-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.w = Witness(self.dir)
        self.addCleanup(self.w.check, self)
        self.jobs = {}

    @staticmethod
    def also_of(lane):
        return ALSO if lane == "e2e" else ("db",) if lane == "ff" else ()

    def job(self, b, name, lane, *options):
        also = self.also_of(lane)
        j = harness.SlotctlRun(SLOTCTL, b.socket_path, lane, self.w.command_until_stopped(name, also), "--job",
                               name, *options)
        self.addCleanup(j.kill)
        self.jobs[name] = j
        return j

    def started(self, name, lane=None):
        """{pool: its start line} once the command logged every pool of its set (its own line comes first)."""
        got = {e.pool: e for e in self.w.started(name)}
        return got if got and (lane is None or len(got) == 1 + len(self.also_of(lane))) else {}

    def running(self, b, name, lane, *options):
        j = self.job(b, name, lane, *options)
        got = wait_for(lambda: self.started(name, lane) or j.proc.poll() is not None, 10,
                       message=f"{name} to start")
        self.assertIsNot(got, True, j.stderr())
        self.assertIsNone(j.proc.poll(), j.stderr())
        return got

    def queued(self, b, name, lane, *options):
        j = self.job(b, name, lane, *options)
        wait_for(lambda: "waiting for" in j.stderr() or j.proc.poll() is not None, 10, message=f"{name} queued")
        self.assertIsNone(j.proc.poll(), j.stderr())
        return j

    def end(self, name):
        self.w.stop(name)
        self.assertEqual(self.jobs[name].wait(10), 0, self.jobs[name].stderr())

    @staticmethod
    def waiter_slots(text, job="set"):
        """{pool: the SLOTS column of job's row under it} from slotctl status's text."""
        got, pool = {}, None
        for line in text.splitlines():
            if line and not line.startswith(" "):
                pool = line.split()[0]
            elif pool and f" {job} " in f"{line} " and line.split()[0].isdigit():
                got[pool] = int(line.split()[2])
        return got

    def in_use(self, b):
        return {p["name"]: p["inUse"] for p in b.status()["pools"]}

    def test_environment_of_every_pool(self):
        b = self.broker(CONFIG, "env")
        p = subprocess.run([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "e2e", "--", "env"],
                           capture_output=True, text=True, timeout=30,
                           env={**os.environ, "SLOT_STALE_TOKEN": "7", "SLOT_STALE_INDEX": "0"})
        self.assertEqual(p.returncode, 0, p.stderr)
        env = dict(line.split("=", 1) for line in p.stdout.splitlines() if line.startswith("SLOT_"))
        self.assertEqual(env["SLOT_POOL"], "grid")
        self.assertEqual(env["SLOT_INDEX"], "0")
        self.assertEqual(env["SLOT_DB_INDEX"], "0")
        self.assertEqual(env["SLOT_LIC_INDEX"], "0,1")
        self.assertEqual(env["SLOT_LIC_MEMBER"], "l1,l2")
        self.assertTrue(int(env["SLOT_DB_TOKEN"]) > 0 and int(env["SLOT_LIC_TOKEN"]) > 0)
        self.assertNotIn("SLOT_DB_MEMBER", env)  # db has no members
        self.assertNotIn("SLOT_STALE_TOKEN", env)  # a parent's set is not the command's
        self.assertNotIn("SLOT_STALE_INDEX", env)
        # Nested: a one-pool run inside does not see the set's pools.
        p = subprocess.run([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "e2e", "--", SLOTCTL, "run",
                            "--socket", b.socket_path, "--lane", "db", "--no-wait", "--", "env"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, EX_TEMPFAIL, p.stderr)  # db is the outer run's
        self.assertEqual(self.in_use(b), {"grid": 0, "db": 0, "lic": 0})

    def test_waits_holding_nothing_and_is_not_passed(self):
        b = self.broker(CONFIG, "wait")
        self.running(b, "d", "db")
        self.queued(b, "set", "e2e")
        self.queued(b, "d2", "db")
        # Nothing of the set is held while it waits.
        self.assertEqual(self.in_use(b), {"grid": 0, "db": 1, "lic": 0})
        # Status: the set waits in every pool of its set (first in each: d holds db, nobody waits before it),
        # and slotctl status lists it under each.
        waiters = {w["job"]: w for w in b.status()["waiters"]}
        self.assertEqual(waiters["set"]["pool"], "grid")
        self.assertEqual(waiters["set"]["also"], ["db", "lic"])
        self.assertEqual(waiters["set"]["position"], 1)
        self.assertEqual(waiters["d2"]["position"], 2)
        self.assertNotIn("also", waiters["d2"])
        text = subprocess.run([SLOTCTL, "status", "--socket", b.socket_path], capture_output=True,
                              text=True).stdout
        self.assertEqual(text.count("(all of grid db lic)"), 3, text)
        # Under each pool, the slots it waits for there: lic:2 is two licences, not the one grid slot.
        self.assertEqual(waiters["set"]["alsoSlots"], [1, 2])
        self.assertEqual(self.waiter_slots(text), {"grid": 1, "db": 1, "lic": 2}, text)
        self.end("d")
        got = wait_for(lambda: self.started("set", "e2e"), 10, message="the set")
        self.assertEqual(sorted(got), ["db", "grid", "lic"])
        self.assertEqual(sorted(got["lic"].slots), ["l1", "l2"])
        self.assertEqual(self.in_use(b), {"grid": 1, "db": 1, "lic": 2})
        self.assertFalse(self.started("d2"), "the one-pool request behind the set took db")
        # Status lists the lease under each pool.
        s = b.status()
        [holder] = [h for h in s["holders"] if h["lease"]["lane"] == "e2e"]
        lease = holder["lease"]
        self.assertEqual(lease["pool"], "grid")
        self.assertEqual({a["pool"]: a["slots"] for a in lease["also"]}, {"db": [0], "lic": [0, 1]})
        self.assertEqual(lease["also"][1]["members"], ["l1", "l2"])
        text = subprocess.run([SLOTCTL, "status", "--socket", b.socket_path], capture_output=True,
                              text=True).stdout
        self.assertEqual(text.count(lease["id"]), 3, text)
        self.end("set")
        wait_for(lambda: self.started("d2"), 10, message="d2 after the set")
        self.end("d2")
        # History: one row per pool of the set, linked by the lease id, each with that pool's token.
        def rows():
            got = [e for e in b.call("io.slotbroker.History", {})["events"] if e.get("lease") == lease["id"]]
            return got if len({(e["pool"], e["decision"]) for e in got}) >= 6 else None
        got = wait_for(rows, 10, message="the set's history rows")
        granted = {e["pool"]: e for e in got if e["decision"] == "granted"}
        self.assertEqual(sorted(granted), ["db", "grid", "lic"])
        self.assertEqual(granted["db"]["token"], lease["also"][0]["token"])
        self.assertEqual(granted["lic"]["token"], lease["also"][1]["token"])
        self.assertEqual(sorted({e["pool"] for e in got if e["decision"] == "released"}), ["db", "grid", "lic"])

    def test_fail_fast_refusal_names_the_pool(self):
        b = self.broker(CONFIG, "busy")
        self.running(b, "d", "db")
        with self.assertRaises(harness.VarlinkError) as e:
            b.call("io.slotbroker.Acquire", {"lane": "ff"})
        self.assertEqual(e.exception.error, "io.slotbroker.Busy")
        self.assertEqual(e.exception.parameters["pool"], "db")
        p = subprocess.run([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "ff", "--", "true"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, EX_TEMPFAIL, p.stderr)
        self.assertIn("db", p.stderr)
        self.assertEqual(self.in_use(b), {"grid": 0, "db": 1, "lic": 0})
        self.end("d")

    def test_history_rows_have_each_pools_slots(self):
        # history.db schema 7: each request's row has the slots it asked of that pool (slotctl simulate
        # --replay asks as many): the set's grant rows 1 of grid, 1 of db, 2 of lic; a refusal that names db
        # has ff's 1 of db; a lone request for db its 1.
        b = self.broker(CONFIG, "slots")
        p = subprocess.run([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "e2e", "--", "true"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.running(b, "d", "db")
        p = subprocess.run([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "ff", "--", "true"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, EX_TEMPFAIL, p.stderr)
        self.end("d")
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        db = sqlite3.connect(f"file:{os.path.join(b.state_dir, 'history.db')}?mode=ro", uri=True)
        rows = db.execute("SELECT decision, pool, lane, slots FROM events WHERE decision IN ('granted', 'busy', "
                          "'released') ORDER BY id").fetchall()
        db.close()
        self.assertEqual(sorted(r for r in rows if r[2] == "e2e" and r[0] == "granted"),
                         [("granted", "db", "e2e", 1), ("granted", "grid", "e2e", 1), ("granted", "lic", "e2e", 2)])
        self.assertIn(("busy", "db", "ff", 1), rows)
        self.assertIn(("granted", "db", "db", 1), rows)
        self.assertTrue(all(r[3] is None for r in rows if r[0] == "released"), rows)
        b.start()

    def test_set_survives_a_restart(self):
        b = self.broker(CONFIG, "restart")
        got = self.running(b, "set", "e2e")
        self.assertEqual(sorted(got), ["db", "grid", "lic"])
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.start()
        # The command still runs: its lease comes back whole from the lease log.
        self.assertEqual(self.in_use(b), {"grid": 1, "db": 1, "lic": 2})
        with self.assertRaises(harness.VarlinkError) as e:
            b.call("io.slotbroker.Acquire", {"lane": "db", "wait": False})
        self.assertEqual(e.exception.error, "io.slotbroker.Busy")
        self.end("set")
        wait_for(lambda: self.in_use(b) == {"grid": 0, "db": 0, "lic": 0}, 10, message="the set to end")

    def test_waiting_set_keeps_its_place_across_a_handover(self):
        b = self.broker(CONFIG, "handover", mode="store")
        self.running(b, "d", "db")
        self.queued(b, "set", "e2e")
        self.queued(b, "d2", "db")
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        self.assertEqual(b.store.names()[0], "sb-state")
        b.start()
        b.store.wait_for(lambda s: s.count() == 0, 10, "brokerd to flush the store")
        self.assertEqual(self.in_use(b), {"grid": 0, "db": 1, "lic": 0})  # still nothing of the set held
        self.end("d")
        got = wait_for(lambda: self.started("set", "e2e"), 10, message="the set after the handover")
        self.assertEqual(sorted(got), ["db", "grid", "lic"])
        self.assertFalse(self.started("d2"), "the one-pool waiter behind the set took db after the handover")
        self.assertNotIn("queued again", self.jobs["set"].stderr())
        self.end("set")
        wait_for(lambda: self.started("d2"), 10, message="d2 after the set")
        self.end("d2")

    def test_a_restart_that_changes_a_lanes_also_refuses_its_waiting_sets_as_a_reload_does(self):
        # An upgrade with a new brokerd.conf, through the fd store: lane e2e's also= loses lic while its set waits.
        # As after a reload, the waiter is refused (unavailable, "reload"), not granted grid and db without the
        # licences its job was queued for.
        b = self.broker(CONFIG, "also-changed", mode="store")
        self.running(b, "d", "db")
        s = self.queued(b, "set", "e2e")
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.write_config(CONFIG.replace("also = db lic:2", "also = db"))
        b.start()
        self.end("d")
        self.assertEqual(s.wait(10), EX_TEMPFAIL, s.stderr())
        self.assertIn("reload", s.stderr())
        self.assertFalse(self.started("set"), "a set granted without the pools it was queued for")

    def test_check_config_refuses_bad_sets_naming_the_lane(self):
        b = harness.Broker(CONFIG, name="check")
        self.addCleanup(b.cleanup)
        out = b.check_config()
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("also=db:1 lic:2", out.stdout.splitlines())
        bad = CONFIG + ("\n[pool shared]\nlimit = 1\nbackend = redis://127.0.0.1:1/0\n"
                        "\n[lane x]\npools = grid\nalso = grid nosuch db:2 shared\n")
        b.write_config(bad)
        out = b.check_config()
        self.assertNotEqual(out.returncode, 0)
        line = bad.splitlines().index("also = grid nosuch db:2 shared") + 1
        where = f"{b.config_path}:{line}: also: lane x"
        for what in ("names its own pool grid", "names pool nosuch, which is not defined",
                     "takes 2 slots of pool db, which has 1", "mixes shared (backend=) and local pools"):
            self.assertIn(f"{where} {what}", out.stderr)
        b.write_config(CONFIG + "\n[lane y]\npools = grid\nalso = db db\n")
        out = b.check_config()
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("also: pool \"db\" is listed twice", out.stderr)


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
