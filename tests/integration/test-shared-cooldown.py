#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Cooldown and reservations on a shared pool (SPEC §3.6, issue 23 items 5, 4 and 7): two brokerds on one real
redis-server, witnessed by the commands (witness.py: a member held twice, or tokens that go back, fail the test).

Member rig of pool rigs, cooldown 5s, kept in Redis:
- a job on node A ends: rig rests in Redis; a fail-fast request on A is refused busy naming the cooldown,
  with a retry hint within it; node B's Status (and `slotctl status`) shows rig resting with its time
  left; B's job waits, and starts only after A's ended and at least the cooldown after A's release (the
  brokers' own records, not a sleep);
- the rest ends by itself: B's job is granted rig at its end (the pool's next_wakeup ticks a node);
- garbage rests written into Redis by hand (an endless one, one of nothing) are ended and counted
  (slotbroker_backend_bad_input_total): the next job gets rig.

Reservations (pool without cooldown): a job holds rig on A, a job waits on B; `slotctl reserve` on A is
first in the pool-wide queue, takes rig when A's job ends (not B's job, who waited longer), is a detached
lease of A's that B's Status lists among the other node's holders; `slotctl release` on A ends it and
B's job gets rig.

A pool's first use waits one node TTL (a recovery window), hence the short backend-node-ttl. Skipped (77)
without redis-server.

Usage: test-shared-cooldown.py BROKERD SLOTCTL [unittest arguments]
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
from harness import wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402
from witness import Witness  # noqa: E402

SLOTCTL = None
TTL = 6
COOLDOWN_MS = 5000


def config(backend, node, cooldown="cooldown = 5s"):
    return f"""\
[broker]
node-name = {node}
revoke-grace = 1s

[pool rigs]
members = rig
{cooldown}
admin-users = {os.getuid()}
backend = {backend}
backend-node-ttl = {TTL}s

[lane w]
pools = rigs
policy = wait

[lane ff]
pools = rigs
policy = fail-fast
"""


def bad_input_total(b):
    for line in b.call("io.slotbroker.Metrics")["text"].splitlines():
        if line.startswith('slotbroker_backend_bad_input_total{pool="rigs"}'):
            return int(float(line.split()[-1]))
    return 0


class SharedCooldown(harness.BrokerTestCase):

    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.dir = tempfile.mkdtemp(prefix="shared-cooldown-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.redis = RedisServer(self.dir).start()
        self.addCleanup(self.redis.close)
        self.w = Witness(self.dir)
        self.addCleanup(self.w.check, self)
        self.jobs = {}

    def job(self, b, name, lane):
        j = harness.SlotctlRun(SLOTCTL, b.socket_path, lane, self.w.command_until_stopped(name), "--job", name)
        self.addCleanup(j.kill)
        self.jobs[name] = j
        return j

    def members(self, name):
        [start] = self.w.started(name) or [None]
        return start and start.slots

    def end(self, name):
        self.w.stop(name)
        self.assertEqual(self.jobs[name].wait(10), 0, self.jobs[name].stderr())

    def history(self, b, job, decision):
        def find():
            for e in b.call("io.slotbroker.History", {})["events"]:
                if e.get("job") == job and e["decision"] == decision:
                    return e
            return None
        return wait_for(find, 10, message=f"{job} {decision} in {b.name}'s history")

    @staticmethod
    def resting(b):
        return {r.get("member"): r["leftMs"] for r in b.pool("rigs").get("resting", [])}

    def test_a_member_released_on_one_node_rests_for_every_node(self):
        a = self.broker(config(self.redis.url(), "node-a"), "cool-a")
        b = self.broker(config(self.redis.url(), "node-b"), "cool-b")
        self.assertEqual(b.pool("rigs").get("cooldownMs"), COOLDOWN_MS)
        first = self.job(a, "first", "w")
        # The pool's first use waits out one TTL (the recovery window): a generous bound, not a sleep.
        self.assertEqual(wait_for(lambda: self.members("first") or first.proc.poll() is not None, TTL + 20,
                                  message="first to start"), ["rig"], first.stderr())
        wait_for(lambda: b.pool("rigs")["backend"]["up"], timeout=30, message="B's backend up")
        self.end("first")
        released = self.history(a, "first", "released")
        # A: rig rests (its own reply's cache); a fail-fast request names the cooldown and when it ends.
        self.assertEqual(list(self.resting(a)), ["rig"])
        with self.assertRaises(harness.VarlinkError) as e:
            a.call("io.slotbroker.Acquire", {"lane": "ff"})
        self.assertEqual(e.exception.error, "io.slotbroker.Busy")
        if self.resting(a):  # unless it ended meanwhile (a loaded machine)
            self.assertEqual(e.exception.parameters.get("reason"), "cooldown", e.exception.parameters)
            self.assertTrue(1 <= e.exception.parameters["retryAfterSec"] <= 5, e.exception.parameters)
        # B: its job waits; its Status shows the pool's rest (its own calls' replies carry it).
        second = self.job(b, "second", "w")
        wait_for(lambda: "waiting for" in second.stderr() or self.members("second") or second.proc.poll() is not None,
                 10, message="second queued")
        rest = wait_for(lambda: self.resting(b) or self.members("second"), 10, message="B to show the rest")
        if isinstance(rest, dict):  # not granted yet: B showed it resting, with its time left
            self.assertEqual(list(rest), ["rig"])
            self.assertTrue(0 < rest["rig"] <= COOLDOWN_MS, rest)
            out = subprocess.run([SLOTCTL, "status", "--socket", b.socket_path], capture_output=True, text=True,
                                 timeout=30).stdout
            if self.resting(b):
                self.assertRegex(out, r"rigs .*cooldown 5s, resting: rig \(")
        self.assertEqual(wait_for(lambda: self.members("second"), COOLDOWN_MS / 1000 + 10,
                                  message="second after the rest"), ["rig"])
        events = [(x.what, x.name) for x in self.w.events()]
        self.assertLess(events.index(("end", "first")), events.index(("start", "second")))
        granted = self.history(b, "second", "granted")
        # Both brokers' realtime clocks are this host's; the history's times are to the ms.
        self.assertGreaterEqual(granted["time"] - released["time"], COOLDOWN_MS * 1000 - 1000, (released, granted))
        self.end("second")
        self.assertEqual(wait_for(lambda: list(self.resting(a)) == ["rig"] or None, 10,
                                  message="A to show B's rest"), True)
        # Hostile content of Redis: rig's rest made endless, a rest of nothing. Each is ended at the next wake
        # and counted as bad input; rig is not parked for good (nor held twice: the witness).
        self.redis.call("ZADD", "{sb:rigs}:rest", "1e300", "rig", "-5", "nonesuch")
        third = self.job(a, "third", "w")
        self.assertEqual(wait_for(lambda: self.members("third") or third.proc.poll() is not None, 20,
                                  message="third despite the garbage"), ["rig"], third.stderr())
        self.assertGreaterEqual(wait_for(lambda: (bad_input_total(a) + bad_input_total(b)) or None, 10,
                                         message="the garbage rests counted"), 1)
        self.end("third")


    def hold(self, member):
        """The reservation's lock file in the witness's books, taken as a command would (O_EXCL)."""
        d = os.path.join(self.dir, "held", "rigs")
        os.makedirs(d, exist_ok=True)
        fd = os.open(os.path.join(d, member), os.O_WRONLY | os.O_CREAT | os.O_EXCL)  # FileExistsError: twice
        os.write(fd, f"reservation {os.getpid()}\n".encode())
        os.close(fd)

    def test_a_reservation_on_one_node_goes_ahead_of_the_other_nodes_waiting_job(self):
        a = self.broker(config(self.redis.url(), "node-a", cooldown=""), "resv-a")
        b = self.broker(config(self.redis.url(), "node-b", cooldown=""), "resv-b")
        first = self.job(a, "first", "w")
        self.assertEqual(wait_for(lambda: self.members("first") or first.proc.poll() is not None, TTL + 20,
                                  message="first to start"), ["rig"], first.stderr())
        wait_for(lambda: b.pool("rigs")["backend"]["up"], timeout=30, message="B's backend up")
        waiting = self.job(b, "waiting", "w")
        wait_for(lambda: "waiting for" in waiting.stderr() or waiting.proc.poll() is not None, 10,
                 message="B's job queued")
        self.assertIsNone(waiting.proc.poll(), waiting.stderr())
        err = harness.StderrFile()
        self.addCleanup(err.close)
        r = subprocess.Popen([SLOTCTL, "reserve", "--socket", a.socket_path, "rigs", "--member", "rig", "--for", "1h",
                              "--reason", "debugging the rig"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                             text=True)
        self.addCleanup(lambda: r.poll() is None and r.kill())

        def r_stderr():
            return err.read()
        wait_for(lambda: "position 1 of 2" in r_stderr() or r.poll() is not None, 10,
                 message="the reservation first of the pool's two waiters")
        self.assertIsNone(r.poll(), r_stderr())
        # A's job ends: the reservation takes rig, not B's job, who waited longer.
        self.end("first")
        out, _ = r.communicate(timeout=20)
        self.assertEqual(r.returncode, 0, r_stderr())
        lease = out.strip()
        self.assertRegex(lease, r"^[0-9a-f]{32}$")
        self.hold("rig")
        self.assertEqual(self.w.started("waiting"), [])
        [h] = [x for x in a.status()["holders"] if x["lease"]["lane"] == "@reserve"]
        self.assertEqual((h["lease"]["id"], h["lease"]["members"], h["lease"]["job"]),
                         (lease, ["rig"], "debugging the rig"))
        wait_for(lambda: [x for x in b.status().get("otherHolders") or []
                          if x["node"] == "node-a" and x["lane"] == "@reserve"] or None, 10,
                 message="B to list A's reservation")
        # slotctl release on A ends it: B's job gets rig.
        os.unlink(os.path.join(self.dir, "held", "rigs", "rig"))
        p = subprocess.run([SLOTCTL, "release", "--socket", a.socket_path, lease], capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(wait_for(lambda: self.members("waiting"), 20, message="B's job after the release"), ["rig"])
        self.end("waiting")


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
