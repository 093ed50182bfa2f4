#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Reload changes a pool's sharing safely (SPEC §11, issue 19 c and f), on two brokerds and real
redis-servers:

- a reload that adds backend= moves the pool: new requests go to the shared pool, the holders of the old
  local pool stay there until they end;
- a reload that removes backend= (the pool made local again, or removed altogether) leaves the old shared
  pool object heartbeating its leases, and releasing them in Redis when they end: another runner's waiter
  is granted within a heartbeat or two, not after a node TTL;
- a reload that changes backend= (another Redis, another db) is refused, reason in the Reload reply,
  while this node holds something in the pool, and applied once it holds nothing;
- a reload that changes backend-node-ttl= is a change of the pool's rules (refused for "rules" until
  every node agrees), never silently ignored;
- a reload that raises revoke-grace= beyond what the node TTL Redis enforces leaves the self-fence (raising
  backend-node-ttl= with it, which Redis has not agreed to yet) is refused with the reason, and revokes
  nothing; raised once Redis agreed to the longer TTL, it is applied;
- a restart whose configuration no longer has the pool (or has it local), while a command of it runs,
  keeps that lease heartbeated in Redis (another runner's command does not start while it runs, also
  after a node TTL) and releases it there when it ends (the other one starts within half a node TTL): the
  lease log records where each shared lease was granted.

Skipped (77) without redis-server or shared pools.

Usage: test-shared-reload.py BROKERD SLOTCTL [unittest arguments]
"""
import shutil
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
import witness  # noqa: E402
from harness import VarlinkError, wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402

SLOTCTL = None
TTL = 12  # seconds: backend-node-ttl, also the recovery window of the pool's first use


def config(node, backend=None, ttl=TTL, grid=True, grace=1):
    shared = f"backend = {backend}\nbackend-node-ttl = {ttl}s\n" if backend else ""
    pools = "grid" if grid else "spare"
    return f"""\
[broker]
node-name = {node}
revoke-grace = {grace}s

[pool spare]
limit = 1

{"[pool grid]" if grid else ""}
{"limit = 1" if grid else ""}
{shared if grid else ""}

[lane ci]
pools = {pools}
policy = wait

[lane now]
pools = {pools}
policy = fail-fast
"""


class TestSharedReload(harness.BrokerTestCase):
    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-reload-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.redis = RedisServer(self.tmp).start()
        self.addCleanup(self.redis.close)

    def backend(self, b):
        return b.pool("grid").get("backend") or {}

    def wait_served(self, b, nodes=2):
        wait_for(lambda: self.backend(b).get("up") and self.backend(b).get("nodes") == nodes, timeout=30,
                 message=f"{b.name} to serve the shared pool with {nodes} nodes live")

    def reload_with(self, b, **kw):
        b.write_config(config(b.name, **kw))
        b.reload()

    def holders(self, b):
        return {e["lease"]["id"] for e in b.status()["holders"]}

    def not_granted_for(self, a, seconds):
        """a (a waiting Acquisition) gets no grant nor refusal for `seconds`: position updates only."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                a.next(left)
            except TimeoutError:
                break
            self.assertFalse(a.granted or a.error, f"expected still waiting, got {a.msg!r}")

    def two_shared(self):
        a, b = (self.broker(config(n, self.redis.url()), n) for n in ("runner-a", "runner-b"))
        for x in (a, b):
            self.wait_served(x)
        return a, b

    def hold_and_wait(self, a, b):
        """a holds the shared slot, b waits for it."""
        held = self.acquire(a, "ci")
        held.until_granted(timeout=TTL + 20)  # the pool's first use waits its recovery window
        waiting = self.acquire(b, "ci")
        waiting.until(lambda x: x.queued or x.granted or x.error, timeout=10, what="b's request queued")
        self.assertTrue(waiting.queued, waiting.msg)
        return held, waiting

    def granted_soon_after(self, held, waiting):
        """held ends: waiting is granted within half a node TTL (the release reached Redis at once, not by
        the node's expiry)."""
        t0 = time.monotonic()
        held.close()
        waiting.until_granted(timeout=TTL + 10)
        elapsed = time.monotonic() - t0
        self.assertLess(elapsed, TTL / 2, f"granted {elapsed:.1f} s after the release: only the node TTL freed it")

    def test_reload_adds_backend(self):
        a = self.broker(config("runner-a"), "runner-a")
        b = self.broker(config("runner-b", self.redis.url()), "runner-b")
        local = self.acquire(a, "ci")
        local.until_granted(timeout=5)  # a's local pool: its only slot

        self.reload_with(a, backend=self.redis.url())
        self.wait_served(a)
        self.wait_served(b)
        # The pool moved: a's next request is the shared pool's, granted there, while the local lease holds on.
        shared = self.acquire(a, "ci")
        shared.until_granted(timeout=TTL + 20)
        self.assertIn(local.lease["id"], self.holders(a))
        self.assertIn(shared.lease["id"], self.holders(a))
        r = self.acquire(b, "now")
        self.assertEqual(r.error, "io.slotbroker.Busy", r.msg)  # one limit across both runners now
        said = local.conn.poll(0.0)
        self.assertIsNone(said, "the old local pool's holder was told something")

    def test_reload_removes_backend(self):
        """Made local by reload: the old shared object keeps the lease heartbeated, then releases it."""
        a, b = self.two_shared()
        held, waiting = self.hold_and_wait(a, b)

        self.reload_with(a)
        self.assertNotIn("backend", a.pool("grid"))
        mine = self.acquire(a, "now")  # the new local pool, its own slot
        self.assertTrue(mine.granted, mine.msg)
        self.not_granted_for(waiting, 3)  # the shared lease is still heartbeated: b's waiter waits
        self.granted_soon_after(held, waiting)

    def test_reload_removes_pool(self):
        """Removed by reload: its last release reaches Redis before the retired pool goes (issue 19 f)."""
        a, b = self.two_shared()
        held, waiting = self.hold_and_wait(a, b)

        self.reload_with(a, grid=False)
        self.not_granted_for(waiting, 3)
        self.granted_soon_after(held, waiting)

    def test_reload_changes_backend(self):
        a, b = self.two_shared()
        held = self.acquire(a, "ci")
        held.until_granted(timeout=TTL + 20)

        # Another database of the same server: refused while a holds a lease there, the reason in the reply.
        a.write_config(config(a.name, self.redis.url(db=1)))
        with self.assertRaises(VarlinkError) as e:
            a.reload()
        self.assertEqual(e.exception.error, "io.slotbroker.ReloadFailed")
        text = " ".join(e.exception.parameters.get("errors", []))
        self.assertIn("backend: pool grid cannot move", text)
        self.assertIn("holds 1 slots", text)
        self.assertTrue(self.backend(a).get("up"), "the refused reload changed the pool")
        self.assertIn(held.lease["id"], self.holders(a))

        # Nothing held here: the same reload is applied, and the pool lives in db 1 from then on.
        held.close()

        def applied():
            try:
                a.reload()
                return True
            except VarlinkError:
                return False  # the release is on its way to Redis
        wait_for(applied, timeout=10, message="the reload to be applied once a holds nothing")
        with self.redis.client(db=1) as c:
            wait_for(lambda: c.call("KEYS", "{sb:grid}*"), timeout=10, message="the pool's keys in db 1")
        wait_for(lambda: self.backend(a).get("up") and self.backend(a).get("nodes") == 1, timeout=30,
                 message="a to serve the pool alone in db 1")

    def test_reload_changes_node_ttl(self):
        """backend-node-ttl= is one of the rules: a reload of one node makes that node refuse the pool for
        its rules until the others agree (never ignored)."""
        a, b = self.two_shared()
        self.reload_with(a, backend=self.redis.url(), ttl=TTL + 2)
        wait_for(lambda: self.backend(a).get("unavailable") == "rules", timeout=10,
                 message="a to refuse the pool for its rules")
        self.assertEqual(self.backend(a).get("differingKeys"), ["backend-node-ttl"], self.backend(a))
        self.reload_with(b, backend=self.redis.url(), ttl=TTL + 2)
        for x in (a, b):
            self.wait_served(x)

    def test_reload_raises_revoke_grace_beyond_the_agreed_ttl(self):
        """revoke-grace=8s needs a node TTL of 13 s; Redis enforces 12 s until every node wants 16 s. Applied at
        once, a's self-fence would have no window left and revoke its lease on the spot."""
        a, b = self.two_shared()
        held = self.acquire(a, "ci")
        held.until_granted(timeout=TTL + 20)  # the pool's first use waits its recovery window
        a.write_config(config(a.name, self.redis.url(), ttl=TTL + 4, grace=8))
        with self.assertRaises(VarlinkError) as e:
            a.reload()
        self.assertEqual(e.exception.error, "io.slotbroker.ReloadFailed")
        text = " ".join(e.exception.parameters.get("errors", []))
        self.assertIn("revoke-grace=8s leaves pool grid no time", text)
        self.assertIsNone(held.conn.poll(3.0), "the holder was told something")  # "revoked", before
        self.assertEqual(self.backend(a).get("differingKeys"), None, self.backend(a))

        # The longer TTL first, on every node: once Redis agreed to it, the longer grace is applied.
        for x in (a, b):
            self.reload_with(x, backend=self.redis.url(), ttl=TTL + 4)
        for x in (a, b):
            self.wait_served(x)

        def applied():
            try:
                self.reload_with(a, backend=self.redis.url(), ttl=TTL + 4, grace=8)
                return True
            except VarlinkError:
                return False  # a's fence still counts with the old TTL: the agreement's answer is on its way
        wait_for(applied, timeout=10, message="the longer grace to be applied")
        self.assertIsNone(held.conn.poll(3.0), "the holder was told something")
        states = {e["lease"]["id"]: e["state"] for e in a.status()["holders"]}
        self.assertEqual(states.get(held.lease["id"]), "held", states)

    def run_witness(self, b, w, name):
        p = subprocess.Popen([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "ci", "--quiet",
                              "--reclaim-for", f"{TTL}s", "--kill-after", "1s", "--",
                              *w.command_until_stopped(name)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: p.poll() is None and p.kill())
        return p

    def test_restart_without_the_pool(self):
        """Restarted with the pool gone from its configuration while a command of it runs (issue 19 f)."""
        self.restart_unshared(config("runner-a", grid=False))

    def test_restart_with_the_pool_local(self):
        """Restarted with the pool made local while a command of it runs: the same, and the local pool serves
        a's new requests meanwhile."""
        a = self.restart_unshared(config("runner-a"), check_local=True)
        self.assertNotIn("backend", a.pool("grid"))

    def restart_unshared(self, new_config, check_local=False):
        a, b = self.two_shared()
        w = witness.Witness(self.tmp)
        cmd_a = self.run_witness(a, w, "on-a")
        wait_for(lambda: w.started("on-a"), timeout=TTL + 20, message="a's command to start")
        cmd_b = self.run_witness(b, w, "on-b")
        wait_for(lambda: self.backend(b).get("waiting") == 1, timeout=10, message="b's command to wait")

        self.assertEqual(a.stop(), 0)
        a.write_config(new_config)
        a.start()
        if check_local:
            mine = self.acquire(a, "now")  # the local pool's own slot, beside the shared lease
            self.assertTrue(mine.granted, mine.msg)
            mine.close()
        # Longer than a node TTL: Redis would have freed a's slot by now if nobody heartbeated it.
        deadline = time.monotonic() + TTL + 4
        while time.monotonic() < deadline:
            self.assertEqual(w.started("on-b"), [], "b's command started while a's still runs")
            if cmd_a.poll() is not None:
                self.fail(f"a's command ended ({cmd_a.returncode}) while brokerd restarted")
            time.sleep(0.5)  # sampling what must not happen, not waiting for something

        t0 = time.monotonic()
        w.stop("on-a")
        self.assertEqual(cmd_a.wait(10), 0)
        wait_for(lambda: w.started("on-b"), timeout=TTL + 10, message="b's command to start")
        elapsed = time.monotonic() - t0
        self.assertLess(elapsed, TTL / 2, f"b's command started {elapsed:.1f} s after a's ended: only the node TTL "
                        "freed the slot")
        w.stop("on-b")
        self.assertEqual(cmd_b.wait(10), 0)
        w.check(self)
        return a


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
