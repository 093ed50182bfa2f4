#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""backend-min-replicas (issue 12): a grant is answered only once WAIT says enough replicas hold its lease.

Real processes, started here on private loopback ports and stopped by pid: a primary and its replica
(redis-server, `replicaof`) and one brokerd whose pool grid (limit 2) has backend = the primary,
backend-min-replicas = 1 and backend-min-replicas-timeout = 500ms.

- The replica up: `slotctl run` gets its slot, and Status shows minReplicas 1 and replicasAcked 1.
- The replica SIGSTOPped (by pid): an acquire is refused unavailable (`slotctl run` exits 75) within about
  the timeout, Status shows replicasAcked 0, and nothing stays held (the lease Redis wrote is given back:
  neither this node's inUse nor every node's counts it).
- The replica SIGCONTinued: grants again.
- --check-config prints the two keys; on a local pool backend-min-replicas is refused.

A SKIP (77) without redis-server or shared pools.

Usage: test-min-replicas.py BROKERD SLOTCTL [unittest arguments]
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
from harness import Broker, wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402

SLOTCTL = None
TIMEOUT = 0.5  # backend-min-replicas-timeout
# The shortest that revoke-grace = 1s allows: a new pool's first grant waits one TTL (the recovery window).
TTL = 6


def config(backend, min_replicas=1):
    return f"""\
[broker]
revoke-grace = 1s

[pool grid]
limit = 2
backend = {backend}
backend-node-ttl = {TTL}s
backend-min-replicas = {min_replicas}
backend-min-replicas-timeout = {int(TIMEOUT * 1000)}ms

[lane grid]
pools = grid
policy = fail-fast
"""


class TestMinReplicas(unittest.TestCase):
    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-min-replicas-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.primary = RedisServer(self.tmp, unix=False, name="primary").start()
        self.addCleanup(self.primary.close)
        self.replica = RedisServer(self.tmp, unix=False, name="replica",
                                   config={"replicaof": f"127.0.0.1 {self.primary.port}"}).start()
        self.addCleanup(self.replica.close)
        # A replica left stopped would outlive the test's cleanup order otherwise.
        self.addCleanup(lambda: self.replica.stopped and self.replica.sigcont())
        wait_for(lambda: self.replica.info("replication").get("master_link_status") == "up", timeout=30,
                 message="the replica to sync")
        self.broker = Broker(config(self.primary.url(tcp=True)), name="node").start()
        self.addCleanup(self.broker.stop)

    def run_true(self):
        """`slotctl run -- true` on the pool: (exit status, seconds it took, stderr)."""
        started = time.monotonic()
        p = subprocess.run([SLOTCTL, "run", "--socket", self.broker.socket_path, "--lane", "grid", "--quiet", "--",
                            "true"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        return p.returncode, time.monotonic() - started, p.stderr.strip()

    def backend(self):
        return self.broker.pool("grid").get("backend") or {}

    def wait_granted(self, message):
        # Refused (75) while the pool is not served yet: the recovery window of a new pool, a reconnect.
        wait_for(lambda: self.run_true()[0] == 0, timeout=TTL + 30, interval=0.2, message=message)

    def nothing_held(self):
        p = self.broker.pool("grid")
        return p["inUse"] == 0 and p["waiting"] == 0 and p.get("backend", {}).get("inUse") == 0

    def test_grants_wait_for_the_replica_and_are_refused_without_it(self):
        self.wait_granted("the first grant")
        backend = self.backend()
        self.assertEqual(backend.get("minReplicas"), 1)
        self.assertEqual(backend.get("replicasAcked"), 1)
        # The replica has the leases the primary wrote: Redis's own view agrees.
        self.assertEqual(self.replica.info("replication").get("role"), "slave")

        self.replica.sigstop()
        status, took, err = self.run_true()
        self.assertEqual(status, 75, f"slotctl run with the replica stopped: {err}")
        # The WAIT's timeout, plus slack for a loaded machine; never the link's 2 s command timeout twice.
        self.assertLess(took, TIMEOUT + 3.0, "the refusal came late")
        self.assertIn("replicas", err)
        self.assertEqual(self.backend().get("replicasAcked"), 0)
        out = subprocess.run([SLOTCTL, "status", "--socket", self.broker.socket_path], capture_output=True,
                             text=True, timeout=30).stdout
        self.assertIn("replicas: a grant waits for 1, 0 acknowledged the last (too few)", out)
        # The lease Redis wrote is given back: nothing held here, nor in Redis (the Status snapshot is
        # fetched every second).
        wait_for(self.nothing_held, timeout=10, message="the refused grant's lease to be given back")
        self.assertTrue(self.backend().get("up"), "a refusal for replicas leaves the pool up")

        self.replica.sigcont()
        self.wait_granted("a grant with the replica back")
        self.assertEqual(self.backend().get("replicasAcked"), 1)
        wait_for(self.nothing_held, timeout=10, message="the pool to be empty again")


class TestMinReplicasConfig(unittest.TestCase):
    def test_check_config_prints_the_keys_and_refuses_them_on_a_local_pool(self):
        tmp = tempfile.mkdtemp(prefix="test-min-replicas-config-")
        self.addCleanup(shutil.rmtree, tmp, True)
        b = Broker(config("redis://10.0.0.11:6379/0", 2), name="check")
        self.addCleanup(b.cleanup)
        out = b.check_config()
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("backend-min-replicas=2", out.stdout.splitlines())
        self.assertIn("backend-min-replicas-timeout=500ms", out.stdout.splitlines())

        b.write_config(config("", 1).replace("backend = \n", ""))
        out = b.check_config()
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("needs a Redis backend=", out.stderr)


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
