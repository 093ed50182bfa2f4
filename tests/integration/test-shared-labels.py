#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Labels and a named member on a pool shared through Redis (SPEC §3.5, "Shared pools"; issue 22 item 5):
two brokerds on a real redis-server, `slotctl run` on both, witnessed by the commands (witness.py: a lock
file per member each command was given, so a member held twice fails the test from the commands' side).

Rigs a b c d: arm64 = a b, usb3 = b c.
- `--member a` on runner-a gets a; `--slots 2 --label arm64` on runner-b waits; `--label arm64` on runner-a
  waits behind it (b is set aside for the two-rig request, across the nodes); `--label usb3` on runner-b
  gets c at once (no use to either waiter: it flows on); a frees → the two-rig waiter gets a and b on
  runner-b; it ends → the one-rig waiter gets a on runner-a.
- A selector no member can ever match exits 64 on a shared pool too, before anything is queued.
- A third brokerd whose labels differ refuses the pool (reason "rules") and its Status names the differing
  label key; the two others serve on.
- A reload of both brokerds that leaves a waiting request's labels fewer members than it asks for refuses
  it when Redis adopts the new rules: unavailable, reason "reload" (the pool is not drained), as an in-process
  pool says.

Skipped (77) without redis-server or shared pools.

Usage: test-shared-labels.py BROKERD SLOTCTL [unittest arguments]
"""
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

TTL = 6  # seconds: backend-node-ttl, the recovery window of the pool's first use
SLOTCTL = None
EX_USAGE = 64


def config(backend, node, arm64="a b"):
    return f"""\
[broker]
node-name = {node}
revoke-grace = 1s

[pool rigs]
members = a b c d
label.arm64 = {arm64}
label.usb3 = b c
backend = {backend}
backend-node-ttl = {TTL}s

[lane w]
pools = rigs
policy = wait
"""


class TestSharedLabels(harness.BrokerTestCase):
    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-labels-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.redis = RedisServer(self.tmp).start()
        self.addCleanup(self.redis.close)
        self.w = Witness(self.tmp)
        self.addCleanup(self.w.check_shared, self, {"rigs": 4})
        self.jobs = {}

    def backend(self, b):
        return b.pool("rigs").get("backend") or {}

    def wait_served(self, b, nodes):
        wait_for(lambda: self.backend(b).get("up") and self.backend(b).get("nodes") == nodes, timeout=30,
                 message=f"{b.name} to serve the pool with {nodes} nodes live")

    def job(self, b, name, *options):
        j = harness.SlotctlRun(SLOTCTL, b.socket_path, "w", self.w.command_until_stopped(name), "--job", name,
                               *options)
        self.addCleanup(j.kill)
        self.jobs[name] = j
        return j

    def members(self, name):
        [start] = self.w.started(name) or [None]
        return start and start.slots

    def running(self, b, name, *options, timeout=10):
        j = self.job(b, name, *options)
        got = wait_for(lambda: self.members(name) or j.proc.poll() is not None, timeout, message=f"{name} to start")
        self.assertIsNot(got, True, j.stderr())
        self.assertIsNone(j.proc.poll(), j.stderr())
        return got

    def queued(self, b, name, *options):
        j = self.job(b, name, *options)
        wait_for(lambda: "waiting for" in j.stderr() or j.proc.poll() is not None, 10, message=f"{name} queued")
        self.assertIsNone(j.proc.poll(), j.stderr())
        return j

    def end(self, name):
        self.w.stop(name)
        self.assertEqual(self.jobs[name].wait(10), 0, self.jobs[name].stderr())

    def test_labels_and_members_across_two_brokerds(self):
        a, b = (self.broker(config(self.redis.url(), name), name) for name in ("runner-a", "runner-b"))
        for x in (a, b):
            self.wait_served(x, 2)
        # The pool's first use waits out its recovery window (one TTL).
        self.assertEqual(self.running(a, "x", "--member", "a", timeout=TTL + 20), ["a"])
        self.queued(b, "two", "--slots", "2", "--label", "arm64")
        self.queued(a, "one", "--label", "arm64")
        self.assertEqual(self.running(b, "usb", "--label", "usb3"), ["c"])
        self.assertIsNone(self.members("two"))
        self.assertIsNone(self.members("one"))

        # Refused before queueing, on a shared pool too.
        for options in (["--label", "gpu"], ["--member", "z"], ["--slots", "3", "--label", "arm64"],
                        ["--label", "arm64", "--label", "!arm64"]):
            p = subprocess.run([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "w", *options, "--", "true"],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, EX_USAGE, (options, p.stderr))

        self.end("x")
        got = wait_for(lambda: self.members("two"), 10, message="two to start")
        self.assertEqual(sorted(got), ["a", "b"])
        self.assertIsNone(self.members("one"))
        self.end("two")
        self.assertEqual(wait_for(lambda: self.members("one"), 10, message="one to start"), ["a"])
        self.end("one")
        self.end("usb")

        # A node with other labels: refused for its rules, the label named; the others serve on.
        c = self.broker(config(self.redis.url(), "runner-c", arm64="a"), "runner-c")
        wait_for(lambda: self.backend(c).get("unavailable") == "rules", timeout=30,
                 message="runner-c to refuse the pool for its rules")
        self.assertEqual(self.backend(c).get("differingKeys"), ["label.arm64"], self.backend(c))
        self.assertEqual(self.running(a, "after", "--label", "arm64"), ["a"])
        self.end("after")


    def test_a_reload_that_takes_the_members_a_waiter_needs_says_reload(self):
        a, b = (self.broker(config(self.redis.url(), name), name) for name in ("runner-a", "runner-b"))
        for x in (a, b):
            self.wait_served(x, 2)
        held = [a.acquire("w", member=m) for m in ("a", "b")]
        for h in held:
            self.addCleanup(h.close)
            h.until_granted(timeout=TTL + 20)  # the pool's first use waits out its recovery window
        waiting = b.acquire("w", slots=2, labels=["arm64"])
        self.addCleanup(waiting.close)
        waiting.until(lambda x: x.queued or x.error, timeout=10, what="b's request queued")
        self.assertTrue(waiting.queued, waiting.msg)

        # arm64 now has one member: the waiter can never be granted two. runner-a first, and its new rules in
        # Redis (it refuses the pool for them) before runner-b's: a Reload's answer does not wait for Redis, and
        # runner-b's rules reaching Redis first would refuse its waiter "rules" (SPEC's agreement rule), not
        # "reload" at the adoption.
        a.write_config(config(self.redis.url(), a.name, arm64="c"))
        a.reload()
        wait_for(lambda: self.backend(a).get("unavailable") == "rules", timeout=10,
                 message="runner-a's new rules to reach Redis")
        b.write_config(config(self.redis.url(), b.name, arm64="c"))
        b.reload()
        waiting.until(lambda x: x.error, timeout=10, what="b's waiter refused")
        self.assertEqual((waiting.error, waiting.params.get("reason")), ("io.slotbroker.Unavailable", "reload"),
                         waiting.msg)
        self.assertNotIn("the pool is drained", b.log())
        self.assertFalse(b.pool("rigs")["drained"])


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
