#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The rolling change of a shared pool's rules, as brokerd.conf(5) (SHARED POOLS, "Agreement on the rules")
tells it, on three brokerds sharing one pool through a real redis-server: limit 2 → 3.

- a runner reloaded before the last refuses the pool (Unavailable, reason "rules"; Status names the keys
  that differ), keeps its lease, and the runners not yet reloaded keep serving it under the old limit;
- the last reload makes every runner serve the pool again, under the new limit;
- the pool is never refused everywhere, and two limits are never enforced at once;
- a waiter refused because a Reload call removed the pool is withdrawn before its client hears of it (the
  order runner-a writes the two in, seen by strace; skipped without it);
- a runner that removed the pool from its configuration while its job holds a lease there keeps the lease and
  holds no rule change of the others back;
- a lease that ends on a runner refusing the pool for its rules is released in Redis at once, and its waiters
  refused there are withdrawn at once (the withdrawal leaves before the refusal reaches the client): the runners still serving the pool grant the slot, rather than see it
  held (or granted to a waiter refused long ago) for as long as the rules differ.

Skipped (77) without redis-server or shared pools.

Usage: test-shared-rolling.py BROKERD [unittest arguments]
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
from harness import wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402

TTL = 6  # seconds: backend-node-ttl, the recovery window of the pool's first use


def config(backend, node, limit):
    return f"""\
[broker]
node-name = {node}
revoke-grace = 1s

[pool grid]
limit = {limit}
backend = {backend}
backend-node-ttl = {TTL}s

[lane ci]
pools = grid
policy = wait

[lane now]
pools = grid
policy = fail-fast
"""


def local_only_config(node):
    """node's configuration once the shared pool is removed from it: its lanes on a local pool instead."""
    return f"""\
[broker]
node-name = {node}
revoke-grace = 1s

[pool local]
limit = 1

[lane ci]
pools = local
policy = wait

[lane now]
pools = local
policy = fail-fast
"""


class TestSharedRolling(harness.BrokerTestCase):
    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-rolling-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.redis = RedisServer(self.tmp).start()
        self.addCleanup(self.redis.close)

    def backend(self, b):
        return b.pool("grid").get("backend") or {}

    def wait_served(self, b, nodes=3):
        wait_for(lambda: self.backend(b).get("up") and self.backend(b).get("nodes") == nodes, timeout=30,
                 message=f"{b.name} to serve the pool with {nodes} nodes live")

    def reload_with(self, b, limit):
        b.write_config(config(self.redis.url(), b.name, limit))
        b.reload()

    def refused_for_rules(self, b, agreed=2):
        """b refuses the pool: its limit differs from the agreed one, which its Status shows beside its own."""
        wait_for(lambda: self.backend(b).get("unavailable") == "rules", timeout=10,
                 message=f"{b.name} to refuse the pool for its rules")
        self.assertEqual(self.backend(b).get("differingKeys"), ["limit"], self.backend(b))
        self.assertEqual(self.backend(b).get("limit"), agreed, self.backend(b))
        r = self.acquire(b, "now")
        r.close()
        self.assertEqual((r.error, r.params.get("reason")), ("io.slotbroker.Unavailable", "rules"), r.msg)

    def busy(self, b):
        """b serves the pool and it is full: a fail-fast request is refused busy (not unavailable)."""
        r = self.acquire(b, "now")
        r.close()
        self.assertEqual(r.error, "io.slotbroker.Busy", r.msg)

    def two_runners_of_one_slot(self):
        a, b = (self.broker(config(self.redis.url(), name, 1), name) for name in ("runner-a", "runner-b"))
        for x in (a, b):
            self.wait_served(x, nodes=2)
        return a, b

    def three_runners_of_two_slots(self):
        a, b, c = (self.broker(config(self.redis.url(), name, 2), name) for name in ("runner-a", "runner-b", "runner-c"))
        for x in (a, b, c):
            self.wait_served(x)
        return a, b, c

    def first_lease(self, b):
        """The pool's first lease, on b (closed at the test's end)."""
        held = self.acquire(b, "ci")
        self.addCleanup(held.close)
        held.until_granted(timeout=TTL + 20)  # the pool's first use waits its recovery window
        return held

    def queued(self, b):
        """A request of lane ci on b, queued."""
        w = self.acquire(b, "ci")
        w.until(lambda x: x.queued or x.granted or x.error, timeout=10, what=f"{b.name}'s request queued")
        self.assertTrue(w.queued, w.msg)
        return w

    def test_a_release_on_a_refusing_runner_frees_the_slot(self):
        """runner-a reloaded first (refusing the pool for its rules) ends its job: runner-b's waiter gets the slot
        within a few heartbeats, not when the rules agree again (here: never, runner-b keeps the old limit)."""
        a, b = self.two_runners_of_one_slot()
        held = self.acquire(a, "ci")
        held.until_granted(timeout=TTL + 20)  # the pool's first use waits its recovery window
        waiting = self.queued(b)

        self.reload_with(a, 2)
        self.refused_for_rules(a, agreed=1)
        self.assertEqual(a.status()["holders"][0]["lease"]["id"], held.lease["id"])
        held.close()
        # Well within a node TTL: runner-a heartbeats all along, so only its release can free the slot.
        waiting.until_granted(timeout=TTL / 2)

    def test_a_waiter_refused_for_the_rules_leaves_the_queue(self):
        """runner-a's waiter, refused when its reload makes the rules differ, is withdrawn from Redis at once: the
        slot runner-b frees goes to runner-b's next waiter, not to the refused one (which nobody would release)."""
        a, b = self.two_runners_of_one_slot()
        held = self.acquire(b, "ci")
        held.until_granted(timeout=TTL + 20)  # the pool's first use waits its recovery window
        refused = self.queued(a)

        self.reload_with(a, 2)
        refused.until(lambda x: x.error, timeout=10, what="a's waiter refused")
        self.assertEqual((refused.error, refused.params.get("reason")), ("io.slotbroker.Unavailable", "rules"),
                         refused.msg)
        # The withdrawal left runner-a before the refusal did: frozen now, it cannot send it any more, and
        # runner-b's waiter is alone in the queue. Redis reads its clients in its own order, not in the order
        # they wrote (a withdraw in its socket buffer may come after a later submit of runner-b's when Redis
        # was off the CPU meanwhile): the queue is waited for to empty first, which it never does if the
        # withdrawal had not left (not until runner-b reaps frozen runner-a, a TTL on: the wait is shorter).
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: self.redis.call("HLEN", "{sb:grid}:w") == 0, timeout=TTL / 3,
                     message="the refused waiter's withdrawal, written before runner-a froze, to reach Redis")
            waiting = self.queued(b)
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        self.assertEqual((waiting.params.get("position"), waiting.params.get("queued")), (1, 1), waiting.msg)
        held.close()
        waiting.until_granted(timeout=TTL / 2)

    def test_a_waiter_refused_by_a_reload_that_removes_the_pool_is_withdrawn_first(self):
        """runner-a's waiter, refused when a Reload call removes the pool there, is withdrawn from Redis before
        its client hears of it: the FCALL that carries the withdraw is written before the refusal (seen by
        strace, in the order runner-a wrote them; the turn of the Reload call hands the refusal on before the
        drain)."""
        strace = shutil.which("strace")
        if not strace:
            self.skipTest("strace is not installed")
        a, b = self.two_runners_of_one_slot()
        held = self.acquire(b, "ci")
        self.addCleanup(held.close)
        held.until_granted(timeout=TTL + 20)  # the pool's first use waits its recovery window
        refused = self.queued(a)

        trace = os.path.join(self.tmp, "strace-a")
        tracer = subprocess.Popen([strace, "-f", "-qq", "-s", "4096", "-xx", "-e", "trace=write,writev,sendmsg,sendto",
                                   "-o", trace, "-p", str(a.pid)], stderr=subprocess.PIPE)
        try:
            # strace says nothing once attached: it is, once the next write of runner-a shows in its output.
            wait_for(lambda: a.status() and os.path.exists(trace) and os.path.getsize(trace) > 0, timeout=10,
                     message="strace to attach to runner-a")
            if tracer.poll() is not None:
                self.skipTest("strace cannot attach: " + tracer.stderr.read().decode(errors="replace"))
            a.write_config(local_only_config(a.name))
            a.reload()
            refused.until(lambda x: x.error, timeout=10, what="a's waiter refused")
            self.assertEqual(refused.error, "io.slotbroker.Unavailable", refused.msg)

            def written():
                """What runner-a wrote, a buffer each, in order (strace -xx: every byte as \\xNN)."""
                with open(trace) as f:
                    return [bytes.fromhex(x.replace("\\x", "")) for x in re.findall(r'"((?:\\x[0-9a-f]{2})*)"', f.read())]

            wait_for(lambda: any(b"withdraw" in w for w in written()), timeout=10,
                     message="runner-a to send the withdraw")
        finally:
            tracer.terminate()
            tracer.communicate()
        order = [("withdraw" if b"withdraw" in w else "refusal") for w in written()
                 if b"withdraw" in w or b"io.slotbroker.Unavailable" in w]
        self.assertEqual(order[0], "withdraw", order)

    def test_a_runner_that_removed_the_pool_holds_no_rule_change_back(self):
        """runner-a removes the pool from its configuration while its job still holds a lease there: it keeps the
        lease, and wants whatever rules the others agree on ("*"), so runner-b and runner-c change the limit 2 → 3
        and serve it under the new limit at once, not when runner-a's job ends."""
        a, b, c = self.three_runners_of_two_slots()
        held = self.first_lease(a)
        a.write_config(local_only_config(a.name))
        a.reload()
        wait_for(lambda: "grid" not in [p["name"] for p in a.status()["pools"]] or a.pool("grid").get("retired"),
                 timeout=10, message="runner-a to drop the pool from its configuration")

        self.reload_with(b, 3)
        self.refused_for_rules(b)  # runner-c still wants 2
        self.reload_with(c, 3)
        for x in (b, c):
            wait_for(lambda: self.backend(x).get("up") and not self.backend(x).get("unavailable"), timeout=10,
                     message=f"{x.name} to serve the pool under the rules runner-b and runner-c agree on")
        # Limit 3 with runner-a's lease counted: two more slots, then busy.
        more = [self.acquire(x, "now") for x in (b, c)]
        for r in more:
            self.addCleanup(r.close)
            r.until_granted(timeout=10)
        self.busy(b)
        self.assertIn(held.lease["id"], [h["lease"]["id"] for h in a.status()["holders"]])
        # runner-a's job ends: its slot is free under the new rules.
        held.close()
        r = self.acquire(c, "ci")
        self.addCleanup(r.close)
        r.until_granted(timeout=TTL / 2)

    def test_a_reload_undone_before_redis_answers_refuses_nobody(self):
        """runner-a reloaded with another limit and back, both before Redis answered the first reload's heartbeat
        (Redis stopped): that answer, "rules", is of rules runner-a no longer wants, and refuses none of its
        waiters; they are served as if nothing happened."""
        a, b = self.two_runners_of_one_slot()
        held = self.acquire(b, "ci")
        held.until_granted(timeout=TTL + 20)  # the pool's first use waits its recovery window
        waiting = self.queued(a)
        self.redis.sigstop()
        try:
            self.reload_with(a, 2)
            self.reload_with(a, 1)
        finally:
            self.redis.sigcont()
        # The answers come now: the first reload's heartbeat "rules", the second one's "ok".
        held.close()
        waiting.until_granted(timeout=TTL)
        self.assertNotIn("RULES_MISMATCH", a.log())

    def test_rolling_limit_change(self):
        a, b, c = self.three_runners_of_two_slots()
        held_a = self.first_lease(a)
        held_b = self.acquire(b, "ci")
        self.addCleanup(held_b.close)
        held_b.until_granted(timeout=10)

        # Step 2: runner-a reloaded first refuses the pool and says why; its lease stays held. The others
        # keep serving it under the old limit: full at 2.
        self.reload_with(a, 3)
        self.refused_for_rules(a)
        self.busy(c)
        self.busy(b)

        # runner-b too: c alone still serves, still at the old limit.
        self.reload_with(b, 3)
        self.refused_for_rules(b)
        self.busy(c)

        # Step 3: the last reload; every runner serves the pool again, under limit 3.
        self.reload_with(c, 3)
        for x in (a, b, c):
            self.wait_served(x)
            self.assertEqual(x.pool("grid")["limit"], 3)
            wait_for(lambda x=x: self.backend(x).get("limit") == 3, timeout=10,
                     message=f"{x.name}'s Status to show the agreed limit 3")
        third = self.acquire(c, "now")
        self.addCleanup(third.close)
        self.assertTrue(third.granted, third.msg)
        self.busy(a)

        # The leases granted under the old rules were never revoked: held, and nothing more said to them.
        for x, h in ((a, held_a), (b, held_b)):
            states = {e["lease"]["id"]: e["state"] for e in x.status()["holders"]}
            self.assertEqual(states.get(h.lease["id"]), "held", states)
            said = h.conn.poll(0.0)
            self.assertIsNone(said, f"{x.name}'s holder was told something")


if __name__ == "__main__":
    (_,), argv = harness.arguments(__doc__, 1)
    harness.main(argv)
