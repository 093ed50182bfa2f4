#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Reload and restart never hand a held slot out again (SPEC §3.4, §4), witnessed by the commands.

Every command is a `slotctl run` of the witness script (witness.py): at its start it creates one lock file
per member it was given (SLOT_MEMBER), or per index (SLOT_INDEX) in a pool of anonymous slots, with O_EXCL
(the shell's noclobber), and logs its token; it removes them when the test tells it to end. A lock file
that already exists is a slot held twice, seen from the commands' side; tokens must be unique and grow in
the order the test obtained the grants (each waits for the command to start before asking again).

- The reload matrix over a member pool: reorder (issue 9, 1a), remove a held member, add it back while
  held, shrink, grow, a drained member across a reorder, a restart with the members reordered; over a
  pool of anonymous slots: shrink, grow.
- A pool removed by reload, brokerd SIGKILLed and started again, the pool added back by reload: the
  first command still runs, so its slot stays taken (issue 9, 1g) and tokens do not go back; nor do they
  when a removed pool comes back by reload after its last lease ended.

Usage: test-reload-members.py BROKERD SLOTCTL [unittest arguments]
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True
import harness  # noqa: E402
from harness import wait_for  # noqa: E402
from witness import Witness  # noqa: E402

SLOTCTL = None
EX_TEMPFAIL = 75

def config(pools, lanes_on=None):
    """pools: {name: "members = a b" or "limit = 2"}; every pool gets a waiting lane w-NAME and a
    fail-fast lane ff-NAME."""
    text = "[broker]\nreclaim-grace = 3s\n"
    for name, spec in pools.items():
        text += f"\n[pool {name}]\n{spec}\n"
        text += f"\n[lane w-{name}]\npools = {name}\npolicy = wait\n"
        text += f"\n[lane ff-{name}]\npools = {name}\npolicy = fail-fast\n"
    return text


class Run:
    """One `slotctl run` of the witness."""

    def __init__(self, test, b, lane, name):
        self.test, self.b, self.name = test, b, name
        self.token = self.pool = None
        self.err = harness.StderrFile()
        self.proc = subprocess.Popen([SLOTCTL, "run", "--socket", b.socket_path, "--lane", lane, "--job", name,
                                      "--", *test.witness.command_until_stopped(name)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.err)
        test.addCleanup(self.kill)

    def stderr(self):
        return self.err.read()

    def started(self):
        """(token, [slots]) once the command runs, else None."""
        [start] = self.test.witness.started(self.name) or [None]
        return start and (start.token, start.slots)

    def stop(self):
        """Ends the command and waits until brokerd has ended its lease: slotctl exits without waiting."""
        self.test.witness.stop(self.name)
        self.test.assertEqual(self.proc.wait(10), 0, self.stderr())
        wait_for(lambda: all(h["lease"]["token"] != self.token or h["lease"]["pool"] != self.pool
                             for h in self.b.status()["holders"]), 10, message=f"the lease of {self.name} to end")

    def kill(self):
        self.test.witness.stop(self.name)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


class ReloadMembers(harness.BrokerTestCase):

    def setUp(self):
        directory = tempfile.mkdtemp(prefix="reload-members-")
        self.addCleanup(shutil.rmtree, directory, True)
        self.witness = Witness(directory)
        self.addCleanup(self.witness.check, self)

    def hold(self, b, pool, name):
        """A command that got a slot of `pool` (waiting lane) and runs; returns (Run, its slots)."""
        r = Run(self, b, f"w-{pool}", name)
        got = wait_for(lambda: r.started() or (r.proc.poll() is not None and ("exited", r.proc.returncode)), 10,
                       message=f"{name} to start")
        self.assertNotEqual(got[0], "exited", r.stderr())
        r.token, r.pool = got[0], pool
        return r, got[1]

    def try_now(self, b, pool, name):
        """A fail-fast `slotctl run`: its slots while it runs, or None when it was refused (exit 75)."""
        r = Run(self, b, f"ff-{pool}", name)
        got = wait_for(lambda: r.started() or (r.proc.poll() is not None and ("exit", r.proc.returncode)), 10,
                       message=f"{name} to start or be refused")
        if got[0] == "exit":
            self.assertEqual(got[1], EX_TEMPFAIL, r.stderr())
            return None, None
        r.token, r.pool = got[0], pool
        return r, got[1]

    def refused(self, b, pool, name):
        r, slots = self.try_now(b, pool, name)
        self.assertIsNone(r, f"{name} was granted {slots}")

    def reload(self, b, pools):
        b.write_config(config(pools))
        b.reload()

    # ---- member pools ----

    def test_reorder_does_not_hand_out_a_held_member(self):
        """Issue 9, 1a, as reported."""
        b = self.broker(config({"rig": "members = rig-a rig-b rig-c"}), "reorder")
        first, slots = self.hold(b, "rig", "first")
        self.assertEqual(slots, ["rig-a"])
        self.reload(b, {"rig": "members = rig-b rig-a rig-c"})
        second, slots = self.try_now(b, "rig", "second")
        self.assertEqual(slots, ["rig-b"])
        third, slots = self.try_now(b, "rig", "third")
        self.assertEqual(slots, ["rig-c"])
        self.refused(b, "rig", "fourth")
        for r in (first, second, third):
            r.stop()
        b.wait_idle()

    def test_removed_member_stays_held_and_comes_back_held(self):
        b = self.broker(config({"rig": "members = rig-a rig-b rig-c"}), "remove-readd")
        a, _ = self.hold(b, "rig", "a")
        self.reload(b, {"rig": "members = rig-b rig-c"})
        # rig-a still runs and counts against the new limit of 2: one slot is left.
        x, slots = self.try_now(b, "rig", "x")
        self.assertEqual(slots, ["rig-b"])
        self.refused(b, "rig", "y")
        self.assertEqual(b.pool("rig")["inUse"], 2)
        self.reload(b, {"rig": "members = rig-a rig-b rig-c"})  # back while a still holds it
        y, slots = self.try_now(b, "rig", "y2")
        self.assertEqual(slots, ["rig-c"])
        self.refused(b, "rig", "z")
        a.stop()
        z, slots = self.try_now(b, "rig", "z2")
        self.assertEqual(slots, ["rig-a"])
        for r in (x, y, z):
            r.stop()
        b.wait_idle()

    def test_removed_member_ending_frees_nothing_it_no_longer_has(self):
        b = self.broker(config({"rig": "members = rig-a rig-b rig-c"}), "remove-end")
        a, _ = self.hold(b, "rig", "a")
        bb, _ = self.hold(b, "rig", "b")
        self.reload(b, {"rig": "members = rig-b rig-c"})
        self.refused(b, "rig", "x")  # two held, limit 2
        a.stop()  # rig-a ends: rig-c is free, rig-b is still held
        x, slots = self.try_now(b, "rig", "x2")
        self.assertEqual(slots, ["rig-c"])
        self.refused(b, "rig", "y")
        for r in (bb, x):
            r.stop()
        b.wait_idle()

    def test_shrink_and_grow_members(self):
        b = self.broker(config({"rig": "members = rig-a rig-b rig-c rig-d"}), "shrink-grow")
        runs = [self.hold(b, "rig", n)[0] for n in ("a", "b", "c", "d")]
        self.reload(b, {"rig": "members = rig-a rig-b"})
        runs[0].stop()
        self.refused(b, "rig", "x")  # rig-b, and rig-c and rig-d above the limit, count against it
        runs[2].stop()
        self.refused(b, "rig", "x2")  # still two held: rig-b, rig-d
        runs[3].stop()
        x, slots = self.try_now(b, "rig", "x3")
        self.assertEqual(slots, ["rig-a"])
        self.reload(b, {"rig": "members = rig-a rig-b rig-c rig-d rig-e"})  # rig-a and rig-b still held
        more = []
        for name, member in (("y", "rig-c"), ("z", "rig-d"), ("v", "rig-e")):
            r, slots = self.try_now(b, "rig", name)
            self.assertEqual(slots, [member])
            more.append(r)
        self.refused(b, "rig", "w")
        for r in (runs[1], x, *more):
            r.stop()
        b.wait_idle()

    def test_drained_member_stays_drained_across_a_reorder(self):
        b = self.broker(config({"rig": "members = rig-a rig-b rig-c"}), "drain-reorder")
        b.call("io.slotbroker.Drain", {"pool": "rig", "member": "rig-b", "on": True})
        a, slots = self.hold(b, "rig", "a")
        self.assertEqual(slots, ["rig-a"])
        self.reload(b, {"rig": "members = rig-b rig-c rig-a"})
        x, slots = self.try_now(b, "rig", "x")
        self.assertEqual(slots, ["rig-c"])
        self.refused(b, "rig", "y")
        for r in (a, x):
            r.stop()
        b.wait_idle()

    def test_restart_with_members_reordered_keeps_the_held_member(self):
        b = self.broker(config({"rig": "members = rig-a rig-b rig-c"}), "restart-reorder")
        a, slots = self.hold(b, "rig", "a")
        self.assertEqual(slots, ["rig-a"])
        b.crash()
        b.write_config(config({"rig": "members = rig-c rig-a rig-b"}))
        b.start()
        x, slots = self.try_now(b, "rig", "x")
        self.assertEqual(slots, ["rig-c"])
        y, slots = self.try_now(b, "rig", "y")
        self.assertEqual(slots, ["rig-b"])
        self.refused(b, "rig", "z")
        for r in (a, x, y):
            r.stop()
        b.wait_idle()

    # ---- anonymous slots ----

    def test_anonymous_shrink_lets_holders_finish_and_grow_adds_slots(self):
        b = self.broker(config({"p": "limit = 3"}), "anon")
        runs = [self.hold(b, "p", n)[0] for n in ("a", "b", "c")]
        self.reload(b, {"p": "limit = 1"})
        runs[0].stop()
        self.refused(b, "p", "x")  # slots 1 and 2 still held, above the limit of 1
        runs[1].stop()
        self.refused(b, "p", "x2")
        self.reload(b, {"p": "limit = 3"})  # slot 2 is inside the limit again, and still held
        x, slots = self.try_now(b, "p", "x3")
        self.assertEqual(slots, ["0"])
        y, slots = self.try_now(b, "p", "y")
        self.assertEqual(slots, ["1"])
        self.refused(b, "p", "z")
        for r in (runs[2], x, y):
            r.stop()
        b.wait_idle()

    # ---- a pool removed, brokerd restarted, the pool back ----

    def test_pool_removed_and_back_continues_its_tokens(self):
        pools = {"grid": "limit = 1", "other": "limit = 1"}
        b = self.broker(config(pools), "readd-tokens")
        first, _ = self.hold(b, "grid", "first")
        self.reload(b, {"other": "limit = 1"})
        first.stop()  # the removed pool goes with its last lease
        self.reload(b, pools)
        second, slots = self.try_now(b, "grid", "second")  # its token must be above first's
        self.assertEqual(slots, ["0"])
        second.stop()

    def restart_with_pool_away(self, spec, while_away=lambda b: None):
        pools = {"grid": spec, "other": "limit = 1"}
        b = self.broker(config(pools), "readd-after-restart")
        first, slots = self.hold(b, "grid", "first")
        self.reload(b, {"other": "limit = 1"})
        b.crash()
        b.start()
        while_away(b)
        self.reload(b, pools)
        return b, first, slots

    def test_pool_removed_then_restart_then_back_keeps_the_slot(self):
        """Issue 9, 1g, as reported."""
        b, first, _ = self.restart_with_pool_away("limit = 1")
        self.refused(b, "grid", "second")  # the first command still runs
        self.assertEqual(b.pool("grid")["inUse"], 1)
        first.stop()
        third, slots = self.try_now(b, "grid", "third")
        self.assertEqual(slots, ["0"])
        third.stop()
        b.wait_idle()

    def test_member_pool_removed_then_restart_then_reordered_back(self):
        def in_status(b):
            [h] = [h for h in b.status()["holders"] if h["lease"]["pool"] == "grid"]
            self.assertEqual(h["lease"]["members"], ["rig-a"])
        b, first, slots = self.restart_with_pool_away("members = rig-a rig-b", in_status)
        self.assertEqual(slots, ["rig-a"])
        b.write_config(config({"grid": "members = rig-b rig-a", "other": "limit = 1"}))
        b.reload()
        second, slots = self.try_now(b, "grid", "second")
        self.assertEqual(slots, ["rig-b"])
        self.refused(b, "grid", "third")
        first.stop()
        second.stop()
        b.wait_idle()

    def test_drains_and_quarantines_hold_when_their_pool_comes_back(self):
        """SPEC §3.6: drains and quarantines survive reloads, also one that removes their pool for a while (it
        goes at once: nothing holds it), and a restart after that."""
        pools = {"rig": "members = rig-a rig-b rig-c", "other": "limit = 1"}
        b = self.broker(config(pools), "readd-lives")
        b.call("io.slotbroker.Quarantine", {"pool": "rig", "member": "rig-a", "reason": "usb hub"})
        b.call("io.slotbroker.Drain", {"pool": "rig", "member": "rig-b", "on": True, "reason": "reflash"})
        self.reload(b, {"other": "limit = 1"})
        self.reload(b, pools)
        x, slots = self.try_now(b, "rig", "x")
        self.assertEqual(slots, ["rig-c"])
        self.refused(b, "rig", "y")
        x.stop()
        self.reload(b, {"other": "limit = 1"})
        b.crash()
        b.start()
        self.reload(b, pools)
        x, slots = self.try_now(b, "rig", "x2")
        self.assertEqual(slots, ["rig-c"])
        self.refused(b, "rig", "y2")
        x.stop()
        b.wait_idle()


class WitnessCanFail(unittest.TestCase):
    """The witness itself, without brokerd: it must see a slot held twice and a token going back."""

    def witness(self):
        directory = tempfile.mkdtemp(prefix="witness-")
        self.addCleanup(shutil.rmtree, directory, True)
        return Witness(directory)

    def run_witness(self, w, name, token, index="0", body=None):
        env = dict(os.environ, SLOT_POOL="p", SLOT_INDEX=index, SLOT_TOKEN=str(token))
        env.pop("SLOT_MEMBER", None)
        argv = w.command(body, name) if body else w.command_until_stopped(name)
        p = subprocess.Popen(argv, env=env)
        self.addCleanup(lambda: (w.stop(name), p.wait(10)))
        wait_for(lambda: w.started(name), 10, message=f"{name} to start")
        return p

    def test_one_holder_at_a_time_passes(self):
        w = self.witness()
        self.run_witness(w, "a", 1, body="true").wait(10)
        self.run_witness(w, "b", 2)
        w.check(self)

    def test_a_slot_held_twice_fails(self):
        w = self.witness()
        self.run_witness(w, "a", 1)
        self.run_witness(w, "b", 2)
        with self.assertRaisesRegex(AssertionError, "held twice"):
            w.check(self)

    def test_a_token_going_back_fails(self):
        w = self.witness()
        self.run_witness(w, "a", 2, index="0")
        self.run_witness(w, "b", 1, index="1")
        with self.assertRaisesRegex(AssertionError, "go back"):
            w.check(self)


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
