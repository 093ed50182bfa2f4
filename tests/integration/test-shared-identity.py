#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A shared pool in an environment that breaks its trust (issue 19; SPEC §11 "One node, one identity").

- cloned state directories: brokerd B starts on a copy of brokerd A's state directory (same node-id, same
  incarnation file, same lease log) while A's command holds the only slot of a limit-1 pool. B is refused
  with reason "node-id-conflict" (Status), A's command keeps its slot past the node TTL, nobody else gets
  it (a third brokerd's waiter, the witness from the commands' side), and B never restores nor fences A's
  lease. After the documented operator action (stop B, remove its node-id and incarnation files, start it)
  B joins with a fresh id, and the slot goes on to the waiter once A's command ends.

A pool's first use waits one node TTL (short here). Skipped (77) without redis-server or shared pools.

Usage: test-shared-identity.py BROKERD SLOTCTL [unittest arguments]
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
from harness import wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402
from witness import Witness  # noqa: E402

TTL = 6  # seconds: backend-node-ttl
SLOTCTL = None


def config(backend, node):
    return f"""\
[broker]
node-name = {node}
revoke-grace = 1s

[pool shared]
limit = 1
backend = {backend}
backend-node-ttl = {TTL}s

[lane ci]
pools = shared
policy = wait

[lane now]
pools = shared
policy = fail-fast
"""


class TestClonedStateDirectory(harness.BrokerTestCase):

    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-identity-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.redis = RedisServer(self.tmp).start()
        self.addCleanup(self.redis.close)
        self.w = Witness(self.tmp)

    def run_witnessed(self, broker, name):
        p = subprocess.Popen([SLOTCTL, "run", "--socket", broker.socket_path, "--lane", "ci", "--job", name,
                              "--quiet", "--", *self.w.command_until_stopped(name)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

        def end():
            self.w.stop(name)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            p.stderr.close()
        self.addCleanup(end)
        return p

    def backend(self, b):
        return b.pool("shared")["backend"]

    def test_a_clone_is_refused_and_the_original_keeps_its_slot(self):
        a = self.broker(config(self.redis.url(), "node-a"), "clone-a")
        c = self.broker(config(self.redis.url(), "node-c"), "clone-c")
        held = self.run_witnessed(a, "held")
        [start] = wait_for(lambda: self.w.started("held"), timeout=TTL + 20, message="A's first grant (one TTL)")
        wait_for(lambda: a.status()["holders"], timeout=10, message="A's holder in its lease log")

        # B: a copy of A's state directory, taken while A runs and holds the slot.
        b = harness.Broker(config(self.redis.url(), "node-b"), name="clone-b")
        shutil.copytree(a.state_dir, b.state_dir)
        with open(os.path.join(a.state_dir, "node-id")) as f:
            node_id = f.read().strip()
        b.start()
        self.addCleanup(self.stop_broker, b)
        wait_for(lambda: self.backend(b).get("unavailable") == "node-id-conflict", timeout=10,
                 message="B refused with node-id-conflict")
        # B neither restored nor holds A's lease (it would fence A's command at its own deadline).
        self.assertEqual(b.status()["holders"], [])
        refused = self.acquire(b, "now")
        self.assertEqual(refused.error, "io.slotbroker.Unavailable", refused.msg)

        # Others wait behind A's command; past the node TTL and more, A's command holds the slot, nobody else
        # got it, B is still refused, and Redis still shows A's lease.
        waiter = self.run_witnessed(c, "waiter")
        wait_for(lambda: c.status()["waiters"], timeout=10, message="C's waiter queued")
        until = time.monotonic() + 2 * TTL
        while time.monotonic() < until:
            self.assertIsNone(held.poll(), "A's command ended")
            self.assertEqual(self.w.ended("held"), [])
            self.assertEqual(self.w.started("waiter"), [], "the slot was granted twice")
            time.sleep(0.2)
        self.assertEqual(self.backend(b).get("unavailable"), "node-id-conflict")
        self.assertEqual([h["lease"]["token"] for h in a.status()["holders"]], [start.token])
        self.assertTrue(self.backend(a)["up"])

        # The operator's action (brokerd(8), "Cloned hosts"): B gets its own id.
        self.stop_broker(b)
        for f in ("node-id", "incarnation"):
            os.unlink(os.path.join(b.state_dir, f))
        b.start()
        wait_for(lambda: self.backend(b)["up"], timeout=15, message="B up under a fresh id")
        with open(os.path.join(b.state_dir, "node-id")) as f:
            self.assertNotEqual(f.read().strip(), node_id)
        self.assertIsNone(held.poll())
        self.assertEqual(self.w.started("waiter"), [])

        self.w.stop("held")
        self.assertEqual(held.wait(10), 0, held.stderr.read())
        [after] = wait_for(lambda: self.w.started("waiter"), timeout=10, message="C's waiter granted")
        self.assertGreater(after.token, start.token)
        self.w.stop("waiter")
        self.assertEqual(waiter.wait(10), 0)
        self.w.check_shared(self, {"shared": 1})


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
