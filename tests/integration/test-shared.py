#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Pools shared through Redis (issue 11): two brokerds on one redis-server enforce one limit.

- one limit across both: holders on A and B together never exceed it; a waiter on B is granted when A
  releases (the grant reaches B through its stream);
- Redis killed: Acquire on the shared pool gets io.slotbroker.Unavailable (reason "backend") with
  retryAfterSec at once, Status says the backend is down, and local pools grant as before;
- Redis back (its data gone): grants resume after the recovery window (one backend-node-ttl, short here);
- `slotctl status` counts every node's holders and waiters in a shared pool's line and lists the other
  node's by its name;
- a clean stop (SIGTERM) of a brokerd takes its waiters out of Redis's queue before it exits, within a
  bound that holds when Redis does not answer, and leaves its leases for a restart to reclaim;
- --check-config accepts backend-user=, backend-password-file=, backend-node-ttl=, node-name= and prints them.

A pool's first use waits one node TTL (memo §3.6: no node can tell a new pool from a lost one), hence
the short backend-node-ttl (revoke-grace 1s keeps it valid). Skipped (77) without redis-server.

Usage: test-shared.py BROKERD SLOTCTL [unittest arguments]
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
from tcpproxy import TcpProxy  # noqa: E402

TTL = 6  # seconds: backend-node-ttl, the recovery window
SLOTCTL = None


def config(backend, node, limit=2, extra=""):
    return f"""\
[broker]
node-name = {node}
revoke-grace = 1s

[pool shared]
limit = {limit}
backend = {backend}
backend-node-ttl = {TTL}s
{extra}
[pool local]
limit = 1

[lane ci]
pools = shared
policy = wait

[lane now]
pools = shared
policy = fail-fast

[lane local]
pools = local
policy = fail-fast
"""


class TestShared(harness.BrokerTestCase):
    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.redis = RedisServer(self.tmp).start()
        self.addCleanup(self.redis.close)

    def granted_in_time(self, b, lane, timeout):
        """An Acquire that waits (lane ci) granted within timeout: its call, still open."""
        a = self.acquire(b, lane)
        self.addCleanup(a.close)
        a.until_granted(timeout=timeout)
        return a

    def wait_backend_up(self, b):
        # Until its first heartbeat is answered a node refuses the pool at once (reason "backend").
        wait_for(lambda: b.pool("shared")["backend"]["up"], timeout=30, message=f"{b.name}: the backend up")

    def first_grant(self, b):
        self.wait_backend_up(b)
        # The first use of a pool waits out one TTL: a generous bound, never a sleep.
        return self.granted_in_time(b, "ci", TTL + 20)

    def test_one_limit_across_two_brokerds(self):
        a = self.broker(config(self.redis.url(), "node-a"), "shared-a")
        b = self.broker(config(self.redis.url(), "node-b"), "shared-b")
        held_a = [self.first_grant(a), self.granted_in_time(a, "ci", 10)]
        self.wait_backend_up(b)
        tokens = {h.lease["token"] for h in held_a}
        self.assertEqual(len(tokens), 2, "fencing tokens are unique per pool")
        self.assertEqual(sorted(h.lease["slots"][0] for h in held_a), [0, 1])

        # The limit is the pool's, not A's: B cannot get a third slot, now or by waiting.
        refused = self.acquire(b, "now")
        self.assertEqual(refused.error, "io.slotbroker.Busy", refused.msg)
        waiter = self.acquire(b, "ci")
        self.addCleanup(waiter.close)
        self.assertEqual(waiter.state, "queued", waiter.msg)

        # Each node's Status lists the other node's entries by the node's name (from a snapshot: wait).
        def others(node, key):
            entries = node.status().get(key) or []
            return entries or None
        held_elsewhere = wait_for(lambda: others(b, "otherHolders"), timeout=10, message="B to list A's holders")
        self.assertEqual(sorted((h["node"], h["pool"], h["slots"][0]) for h in held_elsewhere),
                         [("node-a", "shared", 0), ("node-a", "shared", 1)])
        self.assertEqual({h["token"] for h in held_elsewhere}, tokens)
        self.assertNotIn("uid", held_elsewhere[0])
        waiting_elsewhere = wait_for(lambda: others(a, "otherWaiters"), timeout=10, message="A to list B's waiter")
        self.assertEqual([(w["node"], w["lane"], w["position"]) for w in waiting_elsewhere], [("node-b", "ci", 1)])

        # slotctl status on B: the pool's line counts both nodes, B's own waiter, A's holders by name.
        out = subprocess.run([SLOTCTL, "status", "--socket", b.socket_path], capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        line = next(x for x in lines if x.startswith("shared "))
        self.assertIn("2/2 in use, 1 waiting, here 0 in use, 1 waiting", line)
        self.assertEqual(sorted(x.split()[:3] for x in lines if x.split()[:1] == ["node-a"]),
                         [["node-a", "ci", "0"], ["node-a", "ci", "1"]])

        # A releases one: B's waiter is granted that slot, with a token above both of A's.
        released = held_a.pop(0)
        slot = released.lease["slots"][0]
        released.close()
        waiter.until_granted(timeout=10)
        self.assertEqual(waiter.lease["slots"], [slot])
        self.assertGreater(waiter.lease["token"], max(tokens))
        # Still two holders in all: A's other one, and B's.
        again = self.acquire(a, "now")
        self.assertEqual(again.error, "io.slotbroker.Busy", again.msg)

        # Status and metrics say the backend is up, and how long its calls take.
        backend = b.pool("shared")["backend"]
        self.assertTrue(backend["up"], backend)
        self.assertEqual(backend["nodes"], 2, backend)
        text = b.call("io.slotbroker.Metrics")["text"]
        self.assertIn('slotbroker_backend_up{pool="shared"} 1', text.splitlines())
        self.assertRegex(text, r'slotbroker_backend_rtt_seconds_count\{pool="shared"\} [1-9]')
        self.assertNotIn('slotbroker_backend_up{pool="local"}', text)

    def test_redis_down_then_back(self):
        a = self.broker(config(self.redis.url(), "node-a"), "shared-down")
        self.first_grant(a).close()
        wait_for(lambda: a.pool("shared")["inUse"] == 0, message="the slot released")

        self.redis.kill9()

        def refused_at_once():
            start = time.monotonic()
            r = self.acquire(a, "now")
            r.close()
            if r.error != "io.slotbroker.Unavailable":
                return None
            return r, time.monotonic() - start
        r, elapsed = wait_for(refused_at_once, timeout=10, interval=0.2,
                              message="the shared pool refused while Redis is down")
        self.assertEqual((r.params.get("pool"), r.params.get("reason")), ("shared", "backend"), r.msg)
        self.assertIsInstance(r.params.get("retryAfterSec"), int)
        self.assertLessEqual(elapsed, harness.LATENESS, "refused, but not at once")
        # A waiting lane is refused at once too: nothing to wait for while the backend is away.
        w = self.acquire(a, "ci")
        w.close()
        self.assertEqual(w.error, "io.slotbroker.Unavailable", w.msg)
        backend = a.pool("shared").get("backend")
        self.assertIsNotNone(backend, "Status has the pool's backend")
        self.assertFalse(backend["up"], backend)
        self.assertEqual(backend.get("unavailable"), "backend", backend)
        text = a.call("io.slotbroker.Metrics")["text"]
        self.assertIn('slotbroker_backend_up{pool="shared"} 0', text.splitlines())

        # Local pools are untouched.
        local = self.acquire(a, "local")
        self.assertTrue(local.granted, local.msg)
        local.close()

        # Redis back with nothing: a recovery window (one TTL), then grants again.
        self.redis.restart(keep_data=False)
        self.wait_backend_up(a)
        start = time.monotonic()
        self.granted_in_time(a, "ci", TTL + 20)
        self.assertGreaterEqual(time.monotonic() - start, TTL - 2,
                                "granted before the recovery window had passed")

    def test_check_config_prints_the_keys(self):
        password = os.path.join(self.tmp, "password")
        with open(password, "w") as f:
            f.write("secret\n")
        b = harness.Broker(config(self.redis.url(), "runner-7",
                                  extra=f"backend-user = ci\nbackend-password-file = {password}\n"),
                           name="shared-check")
        self.addCleanup(b.cleanup)
        out = subprocess.run([b.brokerd, "--check-config", "--config", b.config_path],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        for line in ("node-name=runner-7", "backend-user=ci", f"backend-password-file={password}",
                     f"backend-node-ttl={TTL}s"):
            self.assertIn(line, out.stdout.splitlines())

        # A TTL that leaves no heartbeat window once the fence margin is taken off is refused.
        b.write_config(config(self.redis.url(), "runner-7").replace(f"backend-node-ttl = {TTL}s",
                                                                     "backend-node-ttl = 3s"))
        out = subprocess.run([b.brokerd, "--check-config", "--config", b.config_path],
                             capture_output=True, text=True, timeout=30)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("backend-node-ttl", out.stderr)

    # The bound brokerd(8) gives a clean stop to take its waiters out of shared pools (brokerd/manager.c).
    STOP_WITHDRAW_MAX = 1.0

    def test_clean_stop_withdraws_its_waiters(self):
        """SIGTERM of B: its waiter leaves Redis's queue before B exits and B's lease stays (a restart within
        the TTL reclaims it); the slot A frees then goes to A's next waiter at once, not to B's gone client.
        A longer TTL than the other cases: the ghost the stop used to leave held a freed slot until B's node
        expired, at least TTL − 1 s after the stop, far beyond the bounds below."""
        ttl = 10

        def cfg(node):
            return config(self.redis.url(), node).replace(f"backend-node-ttl = {TTL}s", f"backend-node-ttl = {ttl}s")
        a = self.broker(cfg("node-a"), "stop-a")
        b = self.broker(cfg("node-b"), "stop-b")
        self.wait_backend_up(a)
        held_a = self.granted_in_time(a, "ci", ttl + 20)  # the pool's first use waits one TTL
        self.wait_backend_up(b)
        held_b = self.granted_in_time(b, "ci", 10)
        waiter = self.acquire(b, "ci")
        self.assertEqual(waiter.state, "queued", waiter.msg)

        def others(status, key):
            return [(e["node"], e["lane"]) for e in status.get(key) or []]
        wait_for(lambda: others(a.status(), "otherWaiters") == [("node-b", "ci")], timeout=10,
                 message="A to list B's waiter")

        start = time.monotonic()
        self.assertEqual(b.stop(timeout=10), 0, b.log()[-4000:])
        self.assertLess(time.monotonic() - start, self.STOP_WITHDRAW_MAX + harness.LATENESS,
                        "the stop waited longer than its bound")

        # A frees its slot: a new waiter through A has it well before B's node could expire.
        slot = held_a.lease["slots"][0]
        held_a.close()
        fresh = self.acquire(a, "ci")
        fresh.until_granted(timeout=ttl / 2)
        self.assertEqual(fresh.lease["slots"], [slot])
        # A's Status (a snapshot, refreshed every second) lists no waiter of B any more; B's lease stays in
        # Redis until a restart reclaims it, or its node expires: a stop is not a release.
        def without_waiters_of_b():
            status = a.status()
            return None if others(status, "otherWaiters") else status
        status = wait_for(without_waiters_of_b, timeout=ttl / 2, interval=0.2, message="A to list no waiter of B")
        self.assertEqual(others(status, "otherHolders"), [("node-b", "ci")])
        self.assertEqual(held_b.lease["slots"], [1 - slot])

    def test_clean_stop_is_bounded_when_redis_does_not_answer(self):
        """A blackholed Redis (the link still looks up) answers no withdraw: SIGTERM exits all the same,
        within the bound, and cleanly."""
        proxy = TcpProxy(self.redis.address).start()
        self.addCleanup(proxy.close)
        b = self.broker(config(proxy.url(), "node-b", limit=1), "stop-blackholed")
        held = self.first_grant(b)
        waiter = self.acquire(b, "ci")
        self.assertEqual(waiter.state, "queued", waiter.msg)
        self.assertTrue(held.granted)

        proxy.blackhole()
        start = time.monotonic()
        self.assertEqual(b.stop(timeout=10), 0, b.log()[-4000:])
        self.assertLess(time.monotonic() - start, self.STOP_WITHDRAW_MAX + harness.LATENESS,
                        "the stop waited longer than its bound")


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
