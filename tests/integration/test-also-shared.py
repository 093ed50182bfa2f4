#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""All or nothing over shared pools (`also = POOL[:K]…` with backend=, SPEC §3.5 "Shared pools"; issue 22 items
4, 5 and 8): two brokerds (node-a, node-b) on one real redis-server, `slotctl run` on both, witnessed by the
commands (witness.py: a lock file per member or slot of every pool of a job's set, taken from SLOT_<POOL>_TOKEN,
_INDEX and _MEMBER inside the command; a pool of the set missing from its environment is a set held in part).

Pools rigs (members r1 r2 r3, label fast = r1 r2) and db (2 slots), both on the one backend. Lanes: set (rigs +
db), set2 (a fast rig + db:2), cross (db + rigs: a set in the other order), rig and db (one pool each).
- Contention: 13 jobs of every lane from both brokerds at once: no member or slot held twice at any instant,
  never more than a pool's limit, no set held in part (and each pool's share the lane's K), labels honoured,
  every job granted and exiting 0 (no deadlock between the crossing sets, nobody starved).
- A set waiting on node-b for db gets the slot node-a's holder frees (within a heartbeat), not the db request
  queued after it on node-a (Acquire calls: positions 1 and 2 in db's queue).
- A fail-fast set (--no-wait; Acquire wait=false) with one pool full is refused busy naming that pool (exit 75,
  "refused (busy): pool db is full"), whichever of the two it is, and takes nothing of the other.
- A set waiting on node-b holds nothing (the backend's inUse), is listed under both pools (its Waiter's also,
  slotctl status "(all of rigs db)", node-a's otherWaiters in both pools); a drain of db from node-a refuses it
  (exit 75, "refused (unavailable): pool db: drained").
- Status of node-a lists its set lease under both pools (Lease.also with the db token the command saw; slotctl
  status prints the lease id under each), node-b's otherHolders lists it in both pools with both tokens; the
  history has a row per pool of the grant and of the end, linked by the lease id, with each pool's token.
- node-a SIGKILLed and started again at once while its job holds a set: the lease restored whole from its lease
  log and reclaimed in both pools (same tokens), still held past the TTL; node-b's waiting set gets nothing
  until it ends.
- node-a SIGKILLed (by pid) while its job holds a fast rig and both db slots, node-b's set2 waiting for them
  with a fast-rig job and a db job queued behind it: node-a's slotctl fences its command (exit 124); after the
  node TTL node-b's set gets both pools' slots in one grant, before the one-pool jobs behind it (never one pool
  without the other: the witness); node-a restarted no longer holds the lease.

One fleet for the whole run: a shared pool's first use waits one node TTL (its recovery window), paid once.

SetHandover (meson's test-also-shared-handover; its own redis-server, node-a in the harness's mode "store"): a
clean restart of node-a through the fd store while it holds a set and a lone lease and has a set waiting, with
node-b's db job queued behind that set: the leases come back with the same slots and tokens (Status and Redis's
lease records), the waiting set keeps its parts in Redis (same rid, same places) and gets both pools' slots
whole when the holder ends, before node-b's job; Redis's keys sampled throughout never hold a slot twice or
beyond a limit; no job sees a failure.

Skipped (77) without redis-server or shared pools.

Usage: test-also-shared.py BROKERD SLOTCTL [unittest arguments]   (AlsoShared, SetHandover: one class each run)
"""
import itertools
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
from harness import wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402
from witness import Witness  # noqa: E402

SLOTCTL = None
TTL = 6  # seconds: backend-node-ttl, also the recovery window of the pools' first use
EX_TEMPFAIL = 75
EX_FENCED = 124
LIMITS = {"rigs": 3, "db": 2}
FAST = ("r1", "r2")
# The further pools of each lane's set (the witness checks the command got each), and the slots a job of each
# lane holds of each pool.
ALSO = {"set": ("db",), "set2": ("db",), "cross": ("rigs",), "setnow": ("db",)}
SHARES = {"set": {"rigs": 1, "db": 1}, "set2": {"rigs": 1, "db": 2}, "cross": {"db": 1, "rigs": 1},
          "rig": {"rigs": 1}, "db": {"db": 1}}


def config(backend, node):
    return f"""\
[broker]
node-name = {node}
revoke-grace = 1s

[pool rigs]
members = r1 r2 r3
label.fast = {" ".join(FAST)}
backend = {backend}
backend-node-ttl = {TTL}s

[pool db]
limit = {LIMITS["db"]}
backend = {backend}
backend-node-ttl = {TTL}s

[lane set]
pools = rigs
also = db
policy = wait

[lane set2]
pools = rigs
also = db:2
labels = fast
policy = wait

[lane cross]
pools = db
also = rigs
policy = wait

[lane setnow]
pools = rigs
also = db
policy = fail-fast

[lane rig]
pools = rigs
policy = wait

[lane db]
pools = db
policy = wait
"""


class Fleet:
    """The redis-server and the two brokerds of the whole run, made by the first test that runs and stopped
    after the last (their exit statuses checked then)."""

    instance = None
    failed = None  # why the fleet could not be made: the tests after the first fail with it at once

    @classmethod
    def get(cls, test_class):
        if cls.failed:
            raise AssertionError(f"no fleet: {cls.failed}")
        if cls.instance is None:
            cls.instance = cls.__new__(cls)
            test_class.addClassCleanup(cls.instance.close)
            try:
                cls.instance.start()
            except BaseException as e:
                cls.failed = f"{type(e).__name__}: {e}"
                raise
        return cls.instance

    def start(self):
        self.tmp = tempfile.mkdtemp(prefix="test-also-shared-")
        self.redis = RedisServer(self.tmp).start()
        url = self.redis.url()
        self.a = harness.Broker(config(url, "node-a"), name="also-node-a").start()
        self.b = harness.Broker(config(url, "node-b"), name="also-node-b").start()
        for x in (self.a, self.b):
            wait_for(lambda: all(x.pool(p)["backend"]["up"] and x.pool(p)["backend"]["nodes"] == 2 for p in LIMITS),
                     timeout=30, message=f"{x.name} to serve both pools with 2 nodes")
        # The pools' first use waits out their recovery window (one TTL): a grant of a set on each node.
        for x in (self.a, self.b):
            def granted():
                got = x.acquire("set")
                try:
                    got.until(lambda g: g.granted or g.error, timeout=TTL + 20, what="a set's first grant")
                    return got.granted or None
                finally:
                    got.close()
            wait_for(granted, TTL + 25, interval=0.5, message=f"{x.name}: a set granted after the recovery window")
        self.wait_idle()

    def nodes(self):
        return (self.a, self.b)

    def wait_idle(self, timeout=15):
        """Until both nodes see both pools empty in the backend (every node's leases and waiters gone)."""
        def idle():
            for x in self.nodes():
                s = x.status()
                if s["holders"] or s["waiters"] or s.get("otherHolders") or s.get("otherWaiters"):
                    return False
                if any(x.pool(p, s)["backend"]["inUse"] or x.pool(p, s)["backend"]["waiting"] for p in LIMITS):
                    return False
            return True
        wait_for(idle, timeout, message="both pools idle on both nodes")

    def close(self):
        nodes = [x for x in (getattr(self, "a", None), getattr(self, "b", None)) if x]
        statuses = {x.name: x.stop() for x in nodes}
        logs = {x.name: x.log()[-4000:] for x in nodes}
        if getattr(self, "redis", None):
            self.redis.close()
        shutil.rmtree(getattr(self, "tmp", ""), ignore_errors=True)
        bad = {n: s for n, s in statuses.items() if s != 0}
        if bad:
            raise AssertionError(f"brokerds exited with {bad}:\n" + "\n".join(logs[n] for n in bad))


class SetJobs(harness.BrokerTestCase):
    """Witnessed jobs of the lanes above on a test's nodes (nodes()), and what the nodes say of the backend."""

    def nodes(self):
        return self.fleet.nodes()

    # jobs

    def witness_jobs(self, prefix):
        """A fresh witness for this case's jobs; cleanups run last first: the jobs are ended (stopped, killed)
        before the witness is read (no slot twice, limits, no set in part)."""
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.w = Witness(self.dir)
        self.jobs = {}
        self.addCleanup(self.w.check_shared, self, LIMITS)
        self.addCleanup(self.end_all)

    def job(self, node, name, lane, *options, body=None):
        """`slotctl run --lane LANE --job NAME` on node, its command witnessed (every pool of the lane's set);
        it runs `body` (shell text), or until stop(name)."""
        argv = (self.w.command(body, name, ALSO.get(lane, ())) if body is not None else
                self.w.command_until_stopped(name, ALSO.get(lane, ())))
        j = harness.SlotctlRun(SLOTCTL, node.socket_path, lane, argv, "--job", name, *options)
        self.jobs[name] = j
        return j

    def end_all(self):
        for name, j in self.jobs.items():
            self.w.stop(name)
        for j in self.jobs.values():
            try:
                j.wait(10)
            except subprocess.TimeoutExpired:
                pass
            j.kill()

    def started(self, name, lane):
        """{pool: its start line} once the command has logged every pool of its set, else {}."""
        got = {e.pool: e for e in self.w.started(name)}
        return got if len(got) == len(SHARES[lane]) else {}

    def running(self, node, name, lane, *options):
        j = self.job(node, name, lane, *options)
        got = wait_for(lambda: self.started(name, lane) or j.proc.poll() is not None, 15, message=f"{name} to start")
        self.assertIsNot(got, True, j.stderr())
        self.assertIsNone(j.proc.poll(), j.stderr())
        return got

    def queued(self, node, name, lane, *options):
        j = self.job(node, name, lane, *options)
        wait_for(lambda: any(w.get("job") == name for w in node.status()["waiters"]) or j.proc.poll() is not None,
                 10, message=f"{name} queued")
        self.assertIsNone(j.proc.poll(), j.stderr())
        return j

    def end(self, name, status=0):
        self.w.stop(name)
        self.assertEqual(self.jobs[name].wait(10), status, self.jobs[name].stderr())

    def run_now(self, node, lane, *options):
        return subprocess.run([SLOTCTL, "run", "--socket", node.socket_path, "--lane", lane, *options, "--", "true"],
                              capture_output=True, text=True, timeout=30)

    # the backend's view

    def in_use(self, node):
        """{pool: slots held by every node}, as node's last reply from the backend says."""
        s = node.status()
        return {p: node.pool(p, s)["backend"]["inUse"] for p in LIMITS}

    def wait_in_use(self, want, message):
        for x in self.nodes():
            wait_for(lambda: self.in_use(x) == want, 10, message=f"{x.name}: {message} {want}")

    def views(self):
        """Both nodes' Status (what a failure is read against), as JSON lines."""
        out = []
        for x in self.nodes():
            try:
                out.append(f"{x.name}: {json.dumps(x.status(), sort_keys=True)}")
            except Exception as e:  # noqa: BLE001 — a dead node says so
                out.append(f"{x.name}: {type(e).__name__}: {e}")
        return "\n".join(out)

    def history(self, node, **filters):
        events, cursor = [], None
        while True:
            page = node.call("io.slotbroker.History", dict(filters, **({"cursor": cursor} if cursor else {})))
            events += page["events"]
            cursor = page.get("cursor")
            if not cursor:
                return events


class AlsoShared(SetJobs):

    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.fleet = Fleet.get(type(self))
        self.a, self.b = self.fleet.a, self.fleet.b
        self.fleet.wait_idle()
        self.witness_jobs("also-shared-w-")

    # the cases

    def test_contending_sets_from_both_nodes(self):
        """Every lane from both nodes at once: the witness (no member or slot twice, limits, no set in part),
        each set's share of each pool, labels, and every job granted and exiting 0."""
        plan = ["set"] * 3 + ["set2"] * 2 + ["cross"] * 2 + ["rig", "rig:fast", "rig:!fast"] + ["db"] * 3
        random.Random(22).shuffle(plan)  # sets and one-pool requests interleaved in both queues, the same each run
        nodes = itertools.cycle(self.fleet.nodes())
        lanes = {}
        for i, what in enumerate(plan):
            lane, _, label = what.partition(":")
            name = f"j{i:02d}-{lane}"
            lanes[name] = (lane, label)
            # 0.02–0.1 s of holding: the queues stay long while jobs of both nodes come and go.
            self.job(next(nodes), name, lane, *(["--label", label] if label else []),
                     body=f"sleep 0.{2 + 4 * (i % 3):02d}")
        try:
            wait_for(lambda: all(j.proc.poll() is not None for j in self.jobs.values()), 60, interval=0.1,
                     message="every job to end")
        except AssertionError as e:
            left = sorted(name for name, j in self.jobs.items() if j.proc.poll() is None)
            raise AssertionError(f"{e}: still running {left}\n{self.views()}") from None
        for name, j in self.jobs.items():
            self.assertEqual(j.proc.returncode, 0, f"{name}: {j.stderr()}")
        self.w.check_shared(self, LIMITS)
        seen = collections_of(self.w.started())
        self.assertEqual(sorted(seen), sorted(lanes), "jobs that never started their command")
        for name, (lane, label) in lanes.items():
            got = {pool: e.slots for pool, e in seen[name].items()}
            self.assertEqual({pool: len(slots) for pool, slots in got.items()}, SHARES[lane],
                             f"{name} ({lane}) held {got}")
            rigs = set(got.get("rigs", ()))
            if lane == "set2" or label == "fast":
                self.assertLessEqual(rigs, set(FAST), f"{name} got a rig without label fast: {got}")
            if label == "!fast":
                self.assertEqual(rigs, {"r3"}, f"{name} got a fast rig: {got}")
        self.assertEqual({e.name for e in self.w.ended()}, set(lanes), "jobs whose command did not end")
        self.fleet.wait_idle()

    def test_fail_fast_set_names_the_pool_without_room(self):
        # db full (both slots, one job on each node): a set that may not wait is refused naming db, and takes
        # no rig; rigs full: refused naming rigs, and takes no db slot.
        self.running(self.a, "d1", "db")
        self.running(self.b, "d2", "db")
        self.wait_in_use({"rigs": 0, "db": 2}, "db full:")
        for node, lane, options in ((self.a, "set", ["--no-wait"]), (self.b, "setnow", [])):
            p = self.run_now(node, lane, *options)
            self.assertEqual(p.returncode, EX_TEMPFAIL, p.stderr)
            self.assertIn("refused (busy): pool db is full", p.stderr)
        with self.assertRaises(harness.VarlinkError) as e:
            self.b.call("io.slotbroker.Acquire", {"lane": "set", "wait": False})
        self.assertEqual((e.exception.error, e.exception.parameters.get("pool")), ("io.slotbroker.Busy", "db"))
        self.assertEqual(self.in_use(self.a)["rigs"], 0, "a refused set kept a rig")
        self.end("d1")
        self.end("d2")
        for i, node in enumerate((self.a, self.b, self.a)):
            self.running(node, f"r{i}", "rig")
        self.wait_in_use({"rigs": 3, "db": 0}, "rigs full:")
        p = self.run_now(self.b, "set", "--no-wait")
        self.assertEqual(p.returncode, EX_TEMPFAIL, p.stderr)
        self.assertIn("refused (busy): pool rigs is full", p.stderr)
        with self.assertRaises(harness.VarlinkError) as e:
            self.a.call("io.slotbroker.Acquire", {"lane": "cross", "wait": False})
        self.assertEqual((e.exception.error, e.exception.parameters.get("pool")), ("io.slotbroker.Busy", "rigs"))
        self.assertEqual(self.in_use(self.b)["db"], 0, "a refused set kept a db slot")
        for i in range(3):
            self.end(f"r{i}")

    def test_set_is_not_passed_across_nodes(self):
        """A set waiting on node-b for db is first in db's queue: a db request queued after it on node-a does not
        take the slot node-a's holder frees; the set gets it (the hand-on reaches node-b within a heartbeat),
        and the db request the next one. Through Acquire calls: what is timed is brokerd's, not a command's."""
        h1, h2 = self.acquire(self.a, "db"), self.acquire(self.a, "db")
        for h in (h1, h2):
            h.until_granted()
        st = self.acquire(self.b, "set")
        self.assertTrue(st.queued, st.msg)
        self.assertEqual(st.params.get("position"), 1, st.msg)  # first in db's queue, and rigs has room
        d3 = self.acquire(self.a, "db")
        self.assertTrue(d3.queued, d3.msg)
        self.assertEqual(d3.params.get("position"), 2, d3.msg)  # behind node-b's set in db's queue
        self.wait_in_use({"rigs": 0, "db": 2}, "the set waiting holds nothing:")
        freed = time.monotonic()
        h1.close()
        lease = st.until_granted(timeout=10)
        handed = time.monotonic() - freed
        # SPEC §11: a decision reaches its node through the stream, or at the latest at the next heartbeat.
        self.assertLessEqual(handed, 1 + harness.LATENESS, "the set got the freed slot late")
        self.assertEqual([(x["pool"], len(x["slots"])) for x in lease["also"]], [("db", 1)], lease)
        self.assertEqual(len(lease["members"]), 1, lease)
        while (m := d3.conn.poll(0)) is not None:
            self.assertNotIn((m.get("parameters") or {}).get("state"), ("granted",), "the db request passed the set")
        st.close()
        d3.until_granted(timeout=10)
        self.assertGreater(d3.lease["token"], lease["also"][0]["token"])
        d3.close()
        h2.close()

    def test_drain_refuses_a_waiting_set_naming_the_pool(self):
        self.running(self.a, "d1", "db")
        self.running(self.a, "d2", "db")
        j = self.queued(self.b, "waiting", "set")
        # Nothing of the set is held while it waits, on either node's view of the backend.
        self.wait_in_use({"rigs": 0, "db": 2}, "the set waiting holds nothing:")
        [w] = [w for w in self.b.status()["waiters"] if w.get("job") == "waiting"]
        self.assertEqual((w["pool"], w.get("also")), ("rigs", ["db"]), w)
        text = subprocess.run([SLOTCTL, "status", "--socket", self.b.socket_path], capture_output=True,
                              text=True).stdout
        self.assertEqual(text.count("(all of rigs db)"), 2, text)
        # node-a sees node-b's set waiting in both pools.
        wait_for(lambda: {(x["pool"], x["lane"]) for x in self.a.status().get("otherWaiters") or []
                          if x["node"] == "node-b"} == {("rigs", "set"), ("db", "set")}, 10,
                 message="node-a's otherWaiters to list node-b's set in rigs and db")
        self.a.call("io.slotbroker.Drain", {"pool": "db", "on": True})
        try:
            self.assertEqual(j.wait(10), EX_TEMPFAIL, j.stderr())
            self.assertIn("refused (unavailable): pool db: drained", j.stderr())
            self.assertEqual(self.w.started("waiting"), [])
        finally:
            self.b.call("io.slotbroker.Drain", {"pool": "db", "on": False})
        wait_for(lambda: not any(x.pool("db")["drained"] for x in self.fleet.nodes()), 10, message="db undrained")
        self.assertEqual(self.in_use(self.b)["rigs"], 0)
        self.end("d1")
        self.end("d2")

    def test_status_and_history_of_a_set_lease(self):
        got = self.running(self.a, "s", "set")
        s = self.a.status()
        [holder] = [h for h in s["holders"] if h["lease"]["lane"] == "set"]
        lease = holder["lease"]
        self.assertEqual((lease["pool"], lease["token"], lease["members"]),
                         ("rigs", got["rigs"].token, got["rigs"].slots))
        self.assertEqual([(x["pool"], x["token"], [str(i) for i in x["slots"]]) for x in lease["also"]],
                         [("db", got["db"].token, got["db"].slots)])
        self.assertEqual({p: self.a.pool(p, s)["inUse"] for p in LIMITS}, {"rigs": 1, "db": 1})
        text = subprocess.run([SLOTCTL, "status", "--socket", self.a.socket_path], capture_output=True,
                              text=True).stdout
        self.assertEqual(text.count(lease["id"]), 2, text)  # under rigs and under db
        # The other node lists it in both pools, with each pool's token.
        want = {("rigs", got["rigs"].token), ("db", got["db"].token)}
        wait_for(lambda: {(x["pool"], x["token"]) for x in self.b.status().get("otherHolders") or []
                          if x["node"] == "node-a"} == want, 10, message=f"node-b's otherHolders to be {want}")
        self.end("s")

        def rows():
            rs = [e for e in self.history(self.a, lane="set") if e.get("lease") == lease["id"]]
            return rs if len({(e["pool"], e["decision"]) for e in rs}) >= 4 else None
        rs = wait_for(rows, 10, message="the set's history rows")
        self.assertEqual(sorted((e["pool"], e["decision"]) for e in rs),
                         [("db", "granted"), ("db", "released"), ("rigs", "granted"), ("rigs", "released")], rs)
        tokens = {e["pool"]: e.get("token") for e in rs if e["decision"] == "granted"}
        self.assertEqual(tokens, {"rigs": got["rigs"].token, "db": got["db"].token})

    def test_node_restarted_within_its_ttl_keeps_its_set(self):
        """node-a SIGKILLed and started again at once while its job holds a set (a fast rig and both db slots):
        its lease log restores the lease with each pool's share, reclaimed in both pools with the same tokens; past
        the TTL since the crash the backend still holds both for node-a, and node-b's set waiting for them has
        got nothing. It gets them when the job ends."""
        got = self.running(self.a, "kept", "set2")
        self.queued(self.b, "next", "set2")
        [lease] = [h["lease"] for h in self.a.status()["holders"] if h["lease"]["job"] == "kept"]
        self.a.crash()  # SIGKILL by pid
        crashed = time.monotonic()
        self.a.start()

        def held():
            return [h["lease"] for h in self.a.status()["holders"] if h["lease"]["id"] == lease["id"] and
                    h["state"] == "held"]
        [again] = wait_for(held, TTL, message="node-a to restore and reclaim the set's lease")
        self.assertEqual((again["token"], [(x["pool"], x["token"], x["slots"]) for x in again["also"]]),
                         (lease["token"], [(x["pool"], x["token"], x["slots"]) for x in lease["also"]]))
        want = {("rigs", got["rigs"].token), ("db", got["db"].token)}

        def node_a_holds():
            return {(x["pool"], x["token"]) for x in self.b.status().get("otherHolders") or []
                    if x["node"] == "node-a"} == want
        # Past the TTL since the crash (an expiry in between would show): watched, not slept through.
        while time.monotonic() < crashed + TTL + 1:
            self.assertIsNone(self.jobs["kept"].proc.poll(), self.jobs["kept"].stderr())
            self.assertEqual(self.w.started("next"), [], "node-b's set started while node-a's was held")
            wait_for(node_a_holds, 5, message=f"node-b's otherHolders to be {want}")
        self.end("kept")
        nxt = wait_for(lambda: self.started("next", "set2"), 10, message="node-b's set when node-a's ends")
        self.assertGreater(nxt["db"].token, got["db"].token)
        self.end("next")

    def test_node_killed_holding_a_set(self):
        # node-a holds a fast rig and both db slots; node-b's set2 waits for them, with a fast-rig job and a db
        # job queued behind it. The other fast rig is free: set aside for the set, not for the job behind it.
        got = self.running(self.a, "held", "set2")
        self.queued(self.b, "after", "set2")
        self.queued(self.b, "rig-behind", "rig", "--label", "fast")
        self.queued(self.b, "db-behind", "db")
        self.wait_in_use({"rigs": 1, "db": 2}, "the waiting set holds nothing:")
        self.assertEqual(self.w.started("rig-behind"), [], "a fast-rig job took the rig set aside for the set")
        [pgid] = [h["lease"]["commandPid"] for h in self.a.status()["holders"] if h["lease"]["job"] == "held"]
        self.addCleanup(lambda: self.a.alive() or self.a.start())  # for the next test, should this one fail
        self.a.crash()  # SIGKILL by pid
        crashed = time.monotonic()
        self.assertEqual(self.jobs["held"].wait(TTL + 10), EX_FENCED, self.jobs["held"].stderr())
        # What slotctl killed of the command's group after its leader is ours to reap (a subreaper): a zombie
        # would keep the group, and the lease node-a restores below, alive.
        wait_for(lambda: harness.reap() or not harness.group_alive(pgid), 10, message="the fenced command's group gone")
        after = wait_for(lambda: self.started("after", "set2"), TTL + 10, message="node-b's set after node-a's TTL")
        granted = time.monotonic() - crashed
        # The dead node's leases go at its TTL after its last heartbeat (a second at most before the crash).
        self.assertGreaterEqual(granted, TTL - 1 - harness.EARLINESS, "node-b's set was granted before node-a's TTL")
        # Late: the next wrong time would be a second TTL; the witness's start (a dozen processes) comes after.
        self.assertLessEqual(granted, TTL + 2 + 2 * harness.LATENESS, "node-b's set was granted late")
        self.assertEqual(len(after["db"].slots), 2)
        self.assertGreater(after["db"].token, got["db"].token)
        # Neither one-pool job behind the set got what the set waited for before it: each pool's tokens follow
        # its grants' order (the commands' start lines need not: two processes).
        rig = wait_for(lambda: self.started("rig-behind", "rig"), 10, message="the fast-rig job after the set")
        self.assertGreater(rig["rigs"].token, after["rigs"].token, "the fast-rig job behind the set was granted first")
        self.assertEqual(self.w.started("db-behind"), [])
        # node-a restarted (after more than its TTL) no longer holds the lease.
        self.a.start()
        wait_for(lambda: all(self.a.pool(p)["backend"]["up"] for p in LIMITS), 30, message="node-a serving again")
        wait_for(lambda: not self.a.status()["holders"], 10, message="node-a to drop the lease the backend freed")
        self.end("after")
        db = wait_for(lambda: self.started("db-behind", "db"), 10, message="the db job after the set")
        self.assertGreater(db["db"].token, after["db"].token)
        self.end("rig-behind")
        self.end("db-behind")


# A pool's leases as its keys hold them (prelude.lua, lease_put()), read in one script (atomic): { in_use (meta),
# the occupancy bitmap's count, { token, node id, rid, { slot… } }… }.
LEASES_LUA = """
local out = {}
local h = redis.call('HGETALL', KEYS[1] .. ':h')
for i = 1, #h, 2 do
        local a = cmsgpack.unpack(h[i + 1])
        out[#out + 1] = { h[i], a[1], a[2], a[5] }
end
return { tonumber(redis.call('HGET', KEYS[1] .. ':meta', 'in_use') or 0), redis.call('BITCOUNT', KEYS[1] .. ':occ'),
         out }
"""


class RedisWatch:
    """The invariant as Redis keeps it (SPEC §3.4, §11), sampled every 10 ms on a thread of its own while a test
    runs: in each pool, the leases' slots are distinct and at most the pool's limit, and meta's in_use and the
    occupancy bitmap say the same number. What was seen wrong is kept, with the leases of that sample."""

    def __init__(self, redis):
        self.redis = redis
        self.violations = []
        self.samples = 0
        self.most = {p: 0 for p in LIMITS}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def sample(self, conn=None):
        """{pool: (in_use, occupied, {token: (node id, rid, (slot…))})}, each pool's at one instant."""
        conn = conn or self.redis
        out = {}
        for p in LIMITS:
            in_use, occ, leases = conn.call("EVAL", LEASES_LUA, 1, f"{{sb:{p}}}")
            out[p] = (in_use, occ, {int(t): (node, rid, tuple(slots)) for t, node, rid, slots in leases})
        return out

    def leases(self):
        """{pool: {token: (node id, rid, (slot…))}}."""
        return {p: leases for p, (_, _, leases) in self.sample().items()}

    def waiters(self):
        """{pool: {"NODE:RID": waiter id}} of the requests waiting in each pool (the waiter id: its arrival,
        so its place)."""
        out = {}
        for p in LIMITS:
            refs = self.redis.call("HGETALL", f"{{sb:{p}}}:rid")
            out[p] = {k: v[2:] for k, v in zip(refs[::2], refs[1::2]) if v.startswith("w:")}
        return out

    def _run(self):
        with self.redis.client() as conn:
            while not self._stop.is_set():
                for p, (in_use, occ, held) in self.sample(conn).items():
                    slots = [s for _, _, ss in held.values() for s in ss]
                    self.most[p] = max(self.most[p], len(slots))
                    if len(slots) != len(set(slots)) or len(slots) > LIMITS[p] or in_use != len(slots) or occ != in_use:
                        self.violations.append(f"pool {p}: slots {sorted(slots)}, in_use {in_use}, occ {occ}, "
                                               f"leases {held}")
                self.samples += 1
                self._stop.wait(0.01)

    def stop(self, test):
        self._stop.set()
        self._thread.join(10)
        test.assertFalse(self._thread.is_alive(), "the Redis sampler did not stop")
        test.assertGreater(self.samples, 10, "the Redis sampler hardly ran")
        test.assertEqual(self.violations[:5], [], "Redis held a slot twice or beyond its limit")


class SetHandover(SetJobs):
    """A clean restart of node-a through the fd store (systemctl restart with brokerd.socket: harness mode
    "store", fdstore.py) while it holds a set and a lone lease on the shared pools and has a set waiting
    (SPEC §3.4 "a restart loses no waiter", §11 "restarts and upgrades must fail no job"):

    - before: node-a's job `held` holds a set (a rig + a db slot), `lone` the other db slot (a one-pool
      lease beside the set), `waiting` a set queued for db on node-a, and node-b's `behind` a db job queued
      after it (position 2 of db's queue, across the nodes);
    - node-a stopped (SIGTERM: it stores its state and the three connections) and started from the store;
    - after: both leases are held by the same connections with the same ids, slots, members and fencing tokens
      (node-a's Status, and Redis's lease records: same tokens, rids, slots, node), the waiting set is still
      node-a's waiter with its place (nothing granted meanwhile); `held` ending frees both its slots at once,
      the waiting set gets both whole (the db slot freed, not `behind`), then `lone` ending hands db to
      `behind`;
    - throughout (a thread on Redis's keys, RedisWatch): no slot in two leases of a pool, never more than the
      limit, in_use and the bitmap agree; the witness (no slot twice, no set in part, tokens); every job exits
      0 without a refusal, a lost broker or a queue again.

    Found: a waiting set was handed over without its rid (engine_request_remote_id() named no part of a set), so
    the next brokerd submitted it afresh under a new one, at the end of both queues, and the first reconcile
    dropped its old parts: node-b's db job, behind it before the restart, got the db slot the set waited for.

    Its own fleet (node-a in mode "store"): AlsoShared's nodes are bound, and its tests crash node-a."""

    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-also-shared-handover-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.redis = RedisServer(self.tmp).start()
        self.addCleanup(self.redis.close)
        url = self.redis.url()
        self.a = self.broker(config(url, "node-a"), "handover-a", mode="store")
        self.b = self.broker(config(url, "node-b"), "handover-b")
        for x in self.nodes():
            wait_for(lambda x=x: all(x.pool(p)["backend"]["up"] and x.pool(p)["backend"]["nodes"] == 2 for p in LIMITS),
                     timeout=30, message=f"{x.name} to serve both pools with 2 nodes")
        # The pools' first use waits out their recovery window (one TTL): a set granted, then given back.
        first = self.a.acquire("set")
        try:
            first.until(lambda g: g.granted or g.error, timeout=TTL + 20, what="a set's first grant")
            self.assertTrue(first.granted, first.msg)
        finally:
            first.close()
        wait_for(lambda: self.in_use(self.b) == {"rigs": 0, "db": 0}, 10, message="the first set given back")
        self.witness_jobs("also-shared-handover-w-")
        self.watch = RedisWatch(self.redis).start()
        self.addCleanup(self.watch.stop, self)

    def nodes(self):
        return (self.a, self.b)

    def leases_of(self, node):
        """{job: its lease as node's Status lists it, with the holder's state} of node's holders."""
        return {h["lease"]["job"]: dict(h["lease"], state=h["state"]) for h in node.status()["holders"]}

    def assert_no_failure(self):
        for name, j in self.jobs.items():
            err = j.stderr()
            for text in ("refused", "lost the connection", "queued again", "fenced"):
                self.assertNotIn(text, err, f"{name} saw a failure:\n{err}")

    def test_set_held_and_set_waiting_across_a_handover(self):
        held = self.running(self.a, "held", "set")
        lone = self.running(self.a, "lone", "db")
        self.wait_in_use({"rigs": 1, "db": 2}, "the set and the lone lease:")
        self.queued(self.a, "waiting", "set")
        self.queued(self.b, "behind", "db")
        # The waiting set is first in db's queue, node-b's db job second (Redis's order, across the nodes).
        wait_for(lambda: [(w.get("job"), w["position"]) for w in self.b.status()["waiters"]] == [("behind", 2)], 10,
                 message="node-b's db job second in db's queue")
        before = self.leases_of(self.a)
        self.assertEqual(set(before), {"held", "lone"}, before)
        self.assertEqual((before["held"]["token"], before["held"]["members"]), (held["rigs"].token, held["rigs"].slots))
        self.assertEqual([(x["pool"], x["token"], [str(i) for i in x["slots"]]) for x in before["held"]["also"]],
                         [("db", held["db"].token, held["db"].slots)])
        self.assertEqual((before["lone"]["pool"], before["lone"]["token"]), ("db", lone["db"].token))
        redis_before = self.watch.leases()
        waiting_before = self.watch.waiters()
        self.assertEqual({p: len(w) for p, w in waiting_before.items()}, {"rigs": 1, "db": 2}, waiting_before)
        node_a = {node for p in redis_before.values() for node, _, _ in p.values()}
        self.assertEqual(len(node_a), 1, redis_before)  # node-a's three shares only
        self.assertEqual({p: sorted(held) for p, held in redis_before.items()},
                         {"rigs": [held["rigs"].token], "db": sorted([held["db"].token, lone["db"].token])})

        # The restart: every connection handed over, the state first.
        self.assertEqual(self.a.stop(), 0, self.a.log()[-4000:])
        names = self.a.store.names()
        self.assertEqual((names[0], sorted(names[1:])), ("sb-state", ["sb-conn"] * 3), names)
        self.a.start()
        self.a.store.wait_for(lambda s: s.count() == 0, 10, "node-a to flush the store")
        self.assertIn("Handed 3 connection(s) to systemd's fd store: 1 waiting, 2 holding a lease.", self.a.log())

        def held_again():
            now = self.leases_of(self.a)
            return now if all(now.get(j, {}).get("state") == "held" for j in before) else None
        after = wait_for(held_again, TTL, message="node-a to hold both leases again")
        for job, lease in before.items():
            for key in ("id", "pool", "lane", "token", "members", "slots", "also"):
                self.assertEqual(after[job].get(key), lease.get(key), f"{job}'s {key} across the restart")
        self.assertEqual(self.watch.leases(), redis_before, "Redis's leases changed across the restart")
        # The waiting set is node-a's waiter again once Redis answered its resumed submit (its place in both).
        wait_for(lambda: [w.get("job") for w in self.a.status()["waiters"]] == ["waiting"], 10,
                 message="the waiting set to wait on node-a again")
        # Its parts are the ones it had, in both pools: the same rid and waiter ids (its places), none added.
        self.assertEqual(self.watch.waiters(), waiting_before, "the waiting set's parts in Redis changed")
        wait_for(lambda: all(x.pool(p)["backend"]["up"] for x in self.nodes() for p in LIMITS), 30,
                 message="both nodes serving both pools")
        self.assertEqual([(w.get("job"), w["position"]) for w in self.b.status()["waiters"]], [("behind", 2)])
        for name in ("waiting", "behind"):
            self.assertEqual(self.w.started(name), [], f"{name} started while every slot it needs was held")
        for name, j in self.jobs.items():
            self.assertIsNone(j.proc.poll(), f"{name} ended in the restart:\n{j.stderr()}")

        # The holder's release frees both its slots; the waiting set gets them whole, before node-b's db job.
        self.end("held")
        wait_for(lambda: self.started("waiting", "set") or self.w.started("behind"), 10,
                 message="the waiting set (or node-b's db job) after the release")
        self.assertEqual(self.w.started("behind"), [], "node-b's db job passed the waiting set")
        got = self.started("waiting", "set")
        self.assertEqual(got["db"].slots, held["db"].slots, "the set got another db slot than the one freed")
        self.assertGreater(got["db"].token, lone["db"].token)
        self.assertGreater(got["rigs"].token, held["rigs"].token)
        redis_now = self.watch.leases()
        self.assertNotIn(held["rigs"].token, redis_now["rigs"])
        self.assertNotIn(held["db"].token, redis_now["db"])
        self.end("lone")
        nxt = wait_for(lambda: self.started("behind", "db"), 10, message="node-b's db job after the lone lease")
        self.assertEqual(nxt["db"].slots, lone["db"].slots)
        self.end("waiting")
        self.end("behind")
        self.assert_no_failure()
        wait_for(lambda: all(not held for held in self.watch.leases().values()), 10, message="Redis to hold nothing")
        self.assertEqual(self.watch.most, {"rigs": 1, "db": 2})


    def test_a_set_whose_command_ends_during_the_handover_is_given_back_whole(self):
        """`held`'s command ends while node-a is down: its Release waits in the connection the store kept. The
        start restores the set for that connection, takes it back, and the Release gives both shares back to
        Redis at once (not a node TTL later); the waiting set gets them whole, before node-b's db job."""
        held = self.running(self.a, "held", "set")
        self.running(self.a, "lone", "db")
        self.queued(self.a, "waiting", "set")
        self.queued(self.b, "behind", "db")
        wait_for(lambda: [(w.get("job"), w["position"]) for w in self.b.status()["waiters"]] == [("behind", 2)], 10,
                 message="node-b's db job second in db's queue")
        self.assertEqual(self.a.stop(), 0, self.a.log()[-4000:])
        self.w.stop("held")
        wait_for(lambda: self.w.ended("held"), 10, message="held to end while node-a is down")
        self.a.start()
        self.assertEqual(self.jobs["held"].wait(10), 0, self.jobs["held"].stderr())
        self.assertNotIn("could not tell the broker", self.jobs["held"].stderr())
        got = wait_for(lambda: self.started("waiting", "set") or self.w.started("behind"), TTL - 1,
                       message="the waiting set (or node-b's db job) within a node TTL of the restart")
        self.assertEqual(self.w.started("behind"), [], "node-b's db job passed the waiting set")
        self.assertEqual(got["db"].slots, held["db"].slots)
        redis_now = self.watch.leases()
        self.assertNotIn(held["rigs"].token, redis_now["rigs"])
        self.assertNotIn(held["db"].token, redis_now["db"])
        for name in ("lone", "waiting", "behind"):
            self.end(name)
        self.assert_no_failure()

def collections_of(events):
    """{job: {pool: its start Event}} of start lines."""
    out = {}
    for e in events:
        out.setdefault(e.name, {})[e.pool] = e
    return out


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
