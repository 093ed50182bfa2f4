#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A shared pool in an environment that breaks its trust (issue 19; SPEC §11 "One node, one identity",
"What is checked at connect is watched"). Two or three brokerds on one redis-server, a limit-1 shared pool,
the invariant checked from the commands' side (witness.py).

- cloned state directories: brokerd B starts on a copy of brokerd A's state directory (same node-id, same
  incarnation file, same lease log) while A's command holds the only slot of a limit-1 pool. B is refused
  with reason "node-id-conflict" (Status), A's command keeps its slot past the node TTL, nobody else gets
  it (a third brokerd's waiter, the witness from the commands' side), and B never restores nor fences A's
  lease. After the documented operator action (stop B, remove its node-id and incarnation files, start it)
  B joins with a fresh id, and the slot goes on to the waiter once A's command ends.

- a restart that cannot account for a lease Redis holds for its node (A killed, its lease log put back
  to an older copy): the lease is not freed at once nor handed on; B's waiter gets the slot only after
  A's command was fenced (the witness: never two holders), when the lease lapses one node TTL later;
- Redis changed under the pool while A's command holds the slot (TestWatchedRedis): maxmemory-policy set
  to allkeys-lru at run time and memory filled (the pool refused, reason "eviction-policy", on the node that
  holds a lease within the re-check period, on the idle one with its next call, whose INFO goes ahead of it:
  a Status or a request); each key of the pool but meta deleted by hand, one at a time; FLUSHDB;
  SCRIPT FLUSH; FUNCTION FLUSH (the library loaded again); REPLICAOF by hand (refused, reason "replica")
  and back. B's fail-fast requests are never granted while A's command holds the slot, no slot is held
  twice, and grants resume (a command of B gets the slot once A's ends).

A pool's first use waits one node TTL (short here). Skipped (77) without redis-server or shared pools.

Usage: test-shared-hostile.py BROKERD SLOTCTL [unittest arguments]
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
    return harness.shared_pool_config(backend, node, TTL)


class HostileTestCase(harness.BrokerTestCase):

    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-hostile-")
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


class TestClonedStateDirectory(HostileTestCase):

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


class TestConservativeRestart(HostileTestCase):

    def test_a_lease_the_restarted_node_does_not_know_lapses_by_the_ttl(self):
        a = self.broker(config(self.redis.url(), "node-a"), "older-a")
        b = self.broker(config(self.redis.url(), "node-b"), "older-b")
        wait_for(lambda: self.backend(a)["up"], timeout=15, message="A up")
        log = os.path.join(a.state_dir, "leases.log")
        with open(log, "rb") as f:
            older = f.read()  # the lease log before the grant: "an older state directory"
        held = self.run_witnessed(a, "held")
        [start] = wait_for(lambda: self.w.started("held"), timeout=TTL + 20, message="A's first grant")
        wait_for(lambda: self.backend(b)["up"], timeout=15, message="B up")
        after = self.run_witnessed(b, "after")
        wait_for(lambda: b.status()["waiters"], timeout=10, message="B's waiter queued")

        a.crash()
        with open(log, "wb") as f:
            f.write(older)
        a.start()
        # A does not know the lease: its command is fenced by slotctl (no renewal), and the slot goes to B's
        # waiter only after that, when the lease lapses.
        self.assertEqual(held.wait(3 * TTL), 124, "slotctl fences the command its brokerd forgot")
        [s] = wait_for(lambda: self.w.started("after"), timeout=3 * TTL, message="B's waiter granted")
        self.assertGreater(s.token, start.token)
        self.w.stop("after")
        self.assertEqual(after.wait(10), 0)
        self.w.check_shared(self, {"shared": 1})


class TestWatchedRedis(HostileTestCase):
    """A holds the only slot with a witnessed command; Redis is changed under the pool; B's fail-fast
    requests must not be granted meanwhile, and a command of B gets the slot once A's ends."""

    def hold(self):
        self.a = self.broker(config(self.redis.url(), "node-a"), "watched-a")
        self.b = self.broker(config(self.redis.url(), "node-b"), "watched-b")
        self.held = self.run_witnessed(self.a, "held")
        [self.start] = wait_for(lambda: self.w.started("held"), timeout=TTL + 20, message="A's first grant")
        wait_for(lambda: self.backend(self.b)["up"], timeout=15, message="B up")

    def noticed(self, reason):
        """A, which holds the slot, refuses the pool for `reason` within its watch's period; B, which holds
        nothing (its watch rests: no INFO), with its next call, whose INFO goes ahead of it: here its
        Status's (a shared pool's Status fetches the holders) or the probe's."""
        wait_for(lambda: self.backend(self.a).get("unavailable") == reason, timeout=15,
                 message=f"A refusing the pool ({reason})")
        self.probe(reason, held_runs=False)
        wait_for(lambda: self.backend(self.b).get("unavailable") == reason, timeout=15,
                 message=f"B refusing the pool ({reason}) after its call")

    def lease_in_redis(self):
        """A's lease is in Redis (reclaimed after a loss), under its token."""
        try:
            return self.redis.call("HEXISTS", "{sb:shared}:h", str(self.start.token)) == 1
        except Exception:
            return False

    def probe(self, what, held_runs=True):
        """B's fail-fast request, refused while A's command holds the slot. held_runs: A's command must still
        run (its brokerd kept the pool: a refused pool fences its commands at the self-fence deadline)."""
        try:
            r = self.acquire(self.b, "now")
        except Exception:
            return  # B's socket busy or the call failed: not a grant
        try:
            self.assertFalse(r.granted, f"{what}: B was granted the slot A's command holds: {r.msg}")
        finally:
            r.close()
        if held_runs:
            self.assertIsNone(self.held.poll(), f"{what}: A's command ended")
        self.assertEqual(self.w.started("after"), [], f"{what}: the slot was granted twice")

    def probe_until(self, what, predicate, timeout):
        deadline = time.monotonic() + timeout
        while True:
            self.probe(what)
            if predicate():
                return
            self.assertLess(time.monotonic(), deadline, f"{what}: timed out")
            time.sleep(0.1)

    def finish(self):
        """A's command ends; B's gets the slot (grants resumed); the witness's invariant."""
        after = self.run_witnessed(self.b, "after")
        self.w.stop("held")
        self.held.wait(10)
        [s] = wait_for(lambda: self.w.started("after"), timeout=3 * TTL + 10, message="B's command granted")
        self.assertGreater(s.token, self.start.token)
        self.w.stop("after")
        self.assertEqual(after.wait(10), 0)
        self.w.check_shared(self, {"shared": 1})

    def test_keys_deleted_by_hand_flushdb_and_script_flush(self):
        self.hold()
        keys = sorted(k for k in self.redis.call("KEYS", "{sb:shared}*") if k != "{sb:shared}:meta")
        self.assertGreaterEqual(len(keys), 8, keys)
        for key in keys:
            self.redis.call("DEL", key)
            # Until Redis has A's lease again (at once when the loss changed nothing that matters; after
            # A's reclaim in the recovery window when the scripts saw it), and one heartbeat more.
            self.probe_until(f"DEL {key}", self.lease_in_redis, 3 * TTL)
            beat = time.monotonic() + 1.5
            self.probe_until(f"DEL {key}", lambda: time.monotonic() > beat, 5)
        for what in (("FLUSHDB",), ("SCRIPT", "FLUSH"), ("FUNCTION", "FLUSH")):
            self.redis.call(*what)
            self.probe_until(" ".join(what), self.lease_in_redis, 3 * TTL)
        self.assertTrue(self.backend(self.a)["up"])
        self.finish()

    def test_eviction_policy_changed_at_run_time(self):
        self.hold()
        self.redis.call("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
        self.noticed("eviction-policy")
        # Memory pressure: Redis evicts what it likes, the pool's keys included.
        used = int(self.redis.info("memory")["used_memory"])
        self.redis.call("CONFIG", "SET", "maxmemory", str(used + 512 * 1024))
        for i in range(400):
            self.redis.call("SET", f"junk:{i}", "x" * 8192)
        self.probe("evicting", held_runs=False)
        # Put right: the pool is served again, after a reclaim if Redis lost A's lease.
        self.redis.call("CONFIG", "SET", "maxmemory", "0")
        self.redis.call("CONFIG", "SET", "maxmemory-policy", "noeviction")
        for x in (self.a, self.b):
            wait_for(lambda: self.backend(x)["up"], timeout=20, message=f"{x.name} serving the pool again")
        self.finish()

    def test_replicaof_by_hand(self):
        self.hold()
        self.redis.call("REPLICAOF", "127.0.0.1", "1")  # nobody there: a replica that keeps its data
        self.noticed("replica")
        self.probe("replica", held_runs=False)
        self.redis.call("REPLICAOF", "NO", "ONE")
        for x in (self.a, self.b):
            wait_for(lambda: self.backend(x)["up"], timeout=20, message=f"{x.name} serving the pool again")
        self.finish()


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
