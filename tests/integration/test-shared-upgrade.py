#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A fleet upgraded node by node from brokerds that call the scripts with EVALSHA to brokerds that call
the Redis Functions library with FCALL (issue 21; brokerd.conf(5), "Upgrading a fleet"): both kinds of
node serve one pool at once, through one real redis-server.

- runner-old runs the older brokerd ($SLOTBROKER_OLD_BROKERD: a build from before the library), runner-new
  this build; one pool of limit 1;
- a slot held on either side makes the other side's fail-fast request Busy, and a waiter on one side is
  granted the slot the other side releases, both ways: one limit, one queue across the two versions;
- FUNCTION FLUSH under the new node costs it nothing (the library is loaded again at the next call);
- runner-old is then restarted as this build (its state directory kept): both serve the pool again.

Skipped (77) without $SLOTBROKER_OLD_BROKERD, redis-server or shared pools. tools/test.sh sets it; by hand:
    SLOTBROKER_OLD_BROKERD=$(tools/old-brokerd.sh build-old) meson test -C BUILD test-shared-upgrade

Usage: test-shared-upgrade.py BROKERD [unittest arguments]
"""
import os
import shutil
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
from harness import wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402

TTL = 6  # seconds: backend-node-ttl, the recovery window of the pool's first use


def config(backend, node):
    return f"""\
[broker]
node-name = {node}
revoke-grace = 1s

[pool grid]
limit = 1
backend = {backend}
backend-node-ttl = {TTL}s

[lane ci]
pools = grid
policy = wait

[lane now]
pools = grid
policy = fail-fast
"""


class TestSharedUpgrade(harness.BrokerTestCase):
    def setUp(self):
        self.old = os.environ.get("SLOTBROKER_OLD_BROKERD")
        if not self.old or not os.access(self.old, os.X_OK):
            raise unittest.SkipTest("$SLOTBROKER_OLD_BROKERD names no older brokerd")
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-upgrade-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.redis = RedisServer(self.tmp).start()
        self.addCleanup(self.redis.close)

    def backend(self, b):
        return b.pool("grid").get("backend") or {}

    def wait_served(self, b, nodes=2):
        wait_for(lambda: self.backend(b).get("up") and self.backend(b).get("nodes") == nodes, timeout=30,
                 message=f"{b.name} to serve the pool with {nodes} nodes live")

    def busy(self, b):
        r = self.acquire(b, "now")
        r.close()
        self.assertEqual(r.error, "io.slotbroker.Busy", r.msg)

    def hand_over(self, holder_side, waiter_side, first):
        """first (held on holder_side) released: waiter_side's waiter gets the slot; returns its request."""
        self.busy(waiter_side)
        waiter = self.acquire(waiter_side, "ci")
        wait_for(lambda: waiter.queued or waiter.granted or waiter.error, timeout=10,
                 message=f"{waiter_side.name}'s waiter queued")
        self.assertFalse(waiter.granted, waiter.msg)
        first.close()
        waiter.until_granted(timeout=10)
        self.busy(holder_side)
        return waiter

    def test_evalsha_and_fcall_nodes_share_one_pool(self):
        r = self.redis.client()
        old = self.broker(config(self.redis.url(), "runner-old"), "runner-old", brokerd=self.old)
        new = self.broker(config(self.redis.url(), "runner-new"), "runner-new")
        for x in (old, new):
            self.wait_served(x)
        libraries = [lib[1] for lib in r.call("FUNCTION", "LIST")]
        self.assertTrue(any(name.startswith("slotbroker_") for name in libraries), libraries)

        held = self.acquire(old, "ci")
        held.until_granted(timeout=TTL + 20)  # the pool's first use waits its recovery window
        held = self.hand_over(old, new, held)   # old → new
        held = self.hand_over(new, old, held)   # new → old

        # Each kind called its own way: EVALSHA (the older node), FCALL (this build).
        stats = r.call("INFO", "commandstats")
        self.assertIn("cmdstat_evalsha:", stats)
        self.assertIn("cmdstat_fcall:", stats)

        # The library flushed under the new node: its next call loads it again, nothing is refused.
        self.assertEqual(r.call("FUNCTION", "FLUSH"), "OK")
        held = self.hand_over(old, new, held)
        self.assertTrue(self.backend(new).get("up"), self.backend(new))

        # runner-old upgraded in place: the same state directory, this build.
        held.close()
        old.stop()
        old.brokerd = harness.find_brokerd()
        old.start()
        for x in (old, new):
            self.wait_served(x)
        held = self.acquire(old, "ci")
        held.until_granted(timeout=TTL + 20)
        held = self.hand_over(old, new, held)
        held.close()


if __name__ == "__main__":
    (_,), argv = harness.arguments(__doc__, 1)
    harness.main(argv)
