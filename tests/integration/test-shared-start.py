#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A brokerd that starts while a pool shared through Redis is in use fails no job (SPEC §3.4, issue 20
item 3; the systemd lane's phase 8).

Node B holds the pool's only slot; node A, whose link to Redis goes through a proxy, has a `slotctl run`
waiting. A is stopped (SIGTERM, no $NOTIFY_SOCKET: no fd store) and started again while its link cannot
come up yet (the proxy holds the bytes, as a slow connect or a slow Redis would):

- the waiter reconnects and queues again, and a fresh `slotctl run` made right after the start is not
  refused either: both wait for the link, are queued once it is up, are granted in turn when B's holder
  ends, and exit with their commands' own statuses;
- a request that may not wait (a fail-fast lane) is refused at once, as before;
- a link that does not come up within the waiter grace (5 s) refuses the requests held for it, unavailable
  (reason "backend"), as for a link lost later;
- behind Sentinels, a waiter handed over through the fd store (the harness's stand-in) waits for the first
  confirmation of the primary with its place, instead of being refused "unconfirmed" (exit 75);
- a SIGHUP while a stop waits for Redis is refused, logged, and leaves the file to the next start.

Skipped (77) without redis-server or shared pools.

Usage: test-shared-start.py BROKERD SLOTCTL [unittest arguments]
"""
import os
import shutil
import signal
import sys
import tempfile
import time

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
from harness import VarlinkError, wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402
from tcpproxy import TcpProxy  # noqa: E402

SLOTCTL = None
TTL = 6  # backend-node-ttl: the recovery window of the pool's first use
GRACE = 5  # brokerd's waiter grace (backend.c WAITER_GRACE)


def config(backend, node):
    return harness.shared_pool_config(backend, node, TTL)


def job_run(b, status):
    """`slotctl run --lane ci -- sh -c 'exit STATUS'`, stderr kept in a file."""
    return harness.SlotctlRun(SLOTCTL, b.socket_path, "ci", ["sh", "-c", f"exit {status}"])


class SharedStart(harness.BrokerTestCase):

    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-start-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.redis = RedisServer(self.tmp).start()
        self.addCleanup(self.redis.close)
        self.proxy = TcpProxy(self.redis.address).start()
        self.addCleanup(self.proxy.close)
        self.a = self.broker(config(self.proxy.url(), "node-a"), "start-a")
        self.b = self.broker(config(self.redis.url(), "node-b"), "start-b")
        for n in (self.a, self.b):
            wait_for(lambda: n.pool("shared")["backend"]["up"], 30, message=f"{n.name}: the backend up")
        # B holds the only slot (after the first use's recovery window: a generous bound, never a sleep).
        self.held = self.acquire(self.b, "ci")
        self.held.until_granted(timeout=TTL + 20)

    def job(self, b, status):
        j = job_run(b, status)
        self.addCleanup(j.kill)
        return j

    def wait_stderr(self, job, text, timeout=15):
        wait_for(lambda: text in job.stderr() or job.proc.poll() is not None, timeout, message=repr(text))
        self.assertIn(text, job.stderr())

    def restart_a_without_link(self):
        """A stopped (its waiters withdrawn from Redis), then started while the proxy holds its link's bytes.
        Returns the monotonic time just before the start: A's grace cannot begin before it."""
        self.assertEqual(self.a.stop(), 0, self.a.log()[-4000:])
        self.proxy.blackhole()
        before_start = time.monotonic()
        self.a.start()
        self.assertFalse(self.a.pool("shared")["backend"]["up"], "A's link is up through a blackhole")
        return before_start

    def test_waiter_and_fresh_request_wait_for_the_link_at_start(self):
        waiter = self.job(self.a, 7)
        self.wait_stderr(waiter, "waiting for a slot")
        self.restart_a_without_link()
        fresh = self.job(self.a, 9)

        # A fail-fast request is refused at once, as before: its lane would try its next pool.
        with self.assertRaises(VarlinkError) as refused:
            self.a.call("io.slotbroker.Acquire", {"lane": "now"})
        self.assertEqual((refused.exception.error, refused.exception.parameters.get("reason")),
                         ("io.slotbroker.Unavailable", "backend"))

        # Both reach A and wait there for its link (or, before the fix, are refused: exit 75).
        wait_for(lambda: self.a.pool("shared")["waiting"] == 2 or waiter.proc.poll() is not None or
                 fresh.proc.poll() is not None, GRACE, message="both requests held by A")
        self.assertIsNone(waiter.proc.poll(), f"the waiter ended (exit {waiter.proc.returncode}) in the restart:\n"
                          f"{waiter.stderr()}")
        self.assertIsNone(fresh.proc.poll(), f"a request right at the start ended (exit {fresh.proc.returncode}):\n"
                          f"{fresh.stderr()}")
        self.assertFalse(self.a.pool("shared")["backend"]["up"])
        self.proxy.passthrough()

        self.wait_stderr(waiter, "reconnected to the broker; queued again")
        self.wait_stderr(fresh, "waiting for a slot")
        # Queued in Redis: B sees both of A's waiters (from a snapshot: waited for).
        wait_for(lambda: len(self.b.status().get("otherWaiters") or []) == 2, 15, message="B to list A's waiters")
        self.held.close()
        self.assertEqual(waiter.proc.wait(30), 7, waiter.stderr())
        self.assertEqual(fresh.proc.wait(30), 9, fresh.stderr())
        for j in (waiter, fresh):
            self.assertNotIn("refused", j.stderr())
        self.assertNotIn("Request of lane ci refused", self.a.log())

    def test_requests_held_at_start_are_refused_after_the_grace(self):
        before_start = self.restart_a_without_link()
        with self.assertRaises(VarlinkError) as refused:
            self.a.call("io.slotbroker.Acquire", {"lane": "ci"}, timeout=GRACE + 20)
        # Held, not refused at once, then refused as a link down. The grace runs from A's start, not from the
        # call (a start slowed by a loaded machine takes of it), so the bound counts from before the start.
        self.assertGreaterEqual(time.monotonic() - before_start, GRACE - 1)
        self.assertEqual((refused.exception.error, refused.exception.parameters.get("reason")),
                         ("io.slotbroker.Unavailable", "backend"))
        # Once the grace ran out, a request is refused at once until the link is up; then served again.
        with self.assertRaises(VarlinkError) as again:
            self.a.call("io.slotbroker.Acquire", {"lane": "ci"}, timeout=GRACE - 1)
        self.assertEqual(again.exception.parameters.get("reason"), "backend")
        self.proxy.passthrough()
        wait_for(lambda: self.a.pool("shared")["backend"]["up"], 30, message="A's backend up")
        self.held.close()
        self.acquire(self.a, "ci").until_granted(timeout=10)

    def test_a_reload_during_the_stop_is_refused(self):
        """SIGHUP while A's stop waits for Redis to take its waiter out (the link holds the bytes): refused and
        logged, the new file left to the next start (before: applied, and RELOADING=1 and READY=1 sent after
        STOPPING=1)."""
        waiter = self.job(self.a, 7)
        self.wait_stderr(waiter, "waiting for a slot")
        self.proxy.blackhole()
        self.a.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "Waiting up to" in self.a.log(), 10, message="A's stop waiting for Redis")
        self.a.write_config(config(self.proxy.url(), "node-a") + "\n[lane extra]\npools = shared\npolicy = wait\n")
        self.a.sighup()
        self.assertEqual(self.a.stop(timeout=10), 0)
        log = self.a.log()
        self.assertIn("brokerd is stopping; its next start reads the configuration", log)
        self.assertNotIn("Configuration reloaded", log)


class SentinelStart(harness.BrokerTestCase):
    """Behind Sentinels, a pool is not served before a majority of them confirmed its primary: a waiter that
    A hands over through the fd store (mode "store", systemctl restart's stand-in) waits for that
    confirmation with its place, as for the link (before the fix: refused "unconfirmed" at once, exit 75)."""

    def setUp(self):
        faults.skip_unless_shared_pools(self)
        import sentineld
        self.tmp = tempfile.mkdtemp(prefix="test-shared-start-sentinel-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.topology = sentineld.Topology(self.tmp, sentinels=3).start()
        self.addCleanup(self.topology.close)
        url = self.topology.url()
        self.a = self.broker(config(url, "node-a"), "sentinel-a", mode="store")
        self.b = self.broker(config(url, "node-b"), "sentinel-b")
        for n in (self.a, self.b):
            wait_for(lambda n=n: n.pool("shared")["backend"]["up"], 30, message=f"{n.name}: the backend up")
        self.held = self.acquire(self.b, "ci")
        self.held.until_granted(timeout=TTL + 20)

    def test_waiter_handed_over_waits_for_the_first_confirmation(self):
        waiter = job_run(self.a, 7)
        self.addCleanup(waiter.kill)
        wait_for(lambda: "waiting for a slot" in waiter.stderr() or waiter.proc.poll() is not None, 15,
                 message="the waiter queued")
        self.assertEqual(self.a.stop(), 0, self.a.log()[-4000:])
        self.assertIn("sb-conn", self.a.store.names(), "A handed no connection to the store")
        self.a.start()
        self.a.store.wait_for(lambda s: s.count() == 0, 10, "A to flush the store")
        wait_for(lambda: self.a.pool("shared")["backend"]["up"] or waiter.proc.poll() is not None, 30,
                 message="A serves the pool again")
        self.assertIsNone(waiter.proc.poll(), f"the waiter ended (exit {waiter.proc.returncode}) in the restart:\n"
                          f"{waiter.stderr()}\nbrokerd:\n{self.a.log()[-3000:]}")
        wait_for(lambda: len(self.b.status().get("otherWaiters") or []) == 1, 15, message="B to list A's waiter")
        self.held.close()
        self.assertEqual(waiter.proc.wait(30), 7, waiter.stderr())
        for text in ("refused", "queued again", "lost the connection"):
            self.assertNotIn(text, waiter.stderr())
        self.assertNotIn("Request of lane ci refused", self.a.log())


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
