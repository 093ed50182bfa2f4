#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Pools shared through Redis (issue 11): two brokerds on one redis-server enforce one limit.

- one limit across both: holders on A and B together never exceed it; a waiter on B is granted when A
  releases (the grant reaches B through its stream);
- one queue across both: priority first, and no barging (a waiter for 2 slots holds back a waiter for 1
  behind it on the other node); slots handed on A -> B and B -> A;
- Status: each node's own holders and waiters in holders/waiters (positions in the pool-wide queue), the
  other node's in otherHolders/otherWaiters by node name, never both, and `slotctl status` shows them with
  the backend's line; metrics: slotbroker_backend_up and the slotbroker_backend_rtt_seconds histogram;
- brokerd killed and started again within the TTL: `slotctl run`'s command runs on, its lease reclaimed with
  the same token; killed for longer than the TTL: slotctl fences the command (exit 124) before the other
  node is granted its slot, and the restarted brokerd no longer holds the lease;
- a drain on one node refuses the waiters of the other (SPEC §11: one queue; the drain script), undrain
  serves them again;
- a pool added by a reload while the node's XREAD is blocked on its other pools' streams: served at once,
  and another node's hand-on reaches it within the XREAD block (5 s);
- journal (only inside journald-ns.sh, a private journald; a SKIP elsewhere): backend lost and regained,
  recovery window, rules mismatch (with the differing keys), node expired (with its name), leases fenced,
  each with its MESSAGE_ID from units/slotbroker.catalog;
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

Usage: test-shared.py BROKERD SLOTCTL CATALOG [unittest arguments]
       journald-ns.sh python3 test-shared.py BROKERD SLOTCTL CATALOG TestSharedJournal
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
import journal  # noqa: E402
from harness import wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402
from tcpproxy import TcpProxy  # noqa: E402
from witness import Witness  # noqa: E402

TTL = 6  # seconds: backend-node-ttl, the recovery window
# The self-fence margin with revoke-grace 1s (memo §4.3): a node fences TTL − MARGIN after its last heartbeat.
MARGIN = 3
SLOTCTL = None
CATALOG = None


def config(backend, node, limit=2, extra="", ttl=TTL, more=""):
    """Pool "shared" (lanes ci and hi wait, hi first; now fails fast) and a local pool; `more`: further
    sections."""
    return f"""\
[broker]
node-name = {node}
revoke-grace = 1s

[pool shared]
limit = {limit}
backend = {backend}
backend-node-ttl = {ttl}s
{extra}
[pool local]
limit = 1

[lane ci]
pools = shared
policy = wait

[lane hi]
pools = shared
policy = wait
priority = 10

[lane now]
pools = shared
policy = fail-fast

[lane local]
pools = local
policy = fail-fast
{more}"""


def extra_pool(backend, ttl=TTL):
    """A second shared pool, "extra", of one slot on the same backend, with its lane x."""
    return f"""
[pool extra]
limit = 1
backend = {backend}
backend-node-ttl = {ttl}s

[lane x]
pools = extra
policy = wait
"""


def others(node, key):
    """otherHolders or otherWaiters of the node's Status, None while empty (for wait_for)."""
    return node.status().get(key) or None


class SharedTestCase(harness.BrokerTestCase):
    """A redis-server of the test's own, and brokerds on it."""

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

    def slotctl_status(self, b):
        """`slotctl status`'s lines, split into words."""
        out = subprocess.run([SLOTCTL, "status", "--socket", b.socket_path], capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        return [line.split() for line in out.stdout.splitlines()]

    def arrived(self, acquisition):
        """The messages that have arrived on an Acquire call's connection, without waiting for more."""
        out = []
        while True:
            msg = acquisition.conn.poll(0.0)
            if msg is None:
                return out
            acquisition.msg = msg
            out.append(msg)


class TestShared(SharedTestCase):

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
        held_elsewhere = wait_for(lambda: others(b, "otherHolders"), timeout=10, message="B to list A's holders")
        self.assertEqual(sorted((h["node"], h["pool"], h["slots"][0]) for h in held_elsewhere),
                         [("node-a", "shared", 0), ("node-a", "shared", 1)])
        self.assertEqual({h["token"] for h in held_elsewhere}, tokens)
        self.assertNotIn("uid", held_elsewhere[0])
        waiting_elsewhere = wait_for(lambda: others(a, "otherWaiters"), timeout=10, message="A to list B's waiter")
        self.assertEqual([(w["node"], w["lane"], w["position"]) for w in waiting_elsewhere], [("node-b", "ci", 1)])
        # A node's own entries are its holders and waiters, with their clients' details, and never listed
        # again among the other nodes' (io.slotbroker(7), Status).
        own_a, own_b = a.status(), b.status()
        self.assertEqual(sorted(h["lease"]["token"] for h in own_a["holders"]), sorted(tokens))
        self.assertEqual([h["lease"]["pool"] for h in own_a["holders"]], ["shared", "shared"])
        self.assertEqual([(w["pool"], w["lane"], w["position"], w["uid"]) for w in own_b["waiters"]],
                         [("shared", "ci", 1, os.getuid())])
        self.assertEqual((own_b["holders"], own_a["waiters"]), ([], []))
        self.assertFalse([h for h in own_a.get("otherHolders") or [] if h["node"] == "node-a"], own_a)
        self.assertFalse([w for w in own_b.get("otherWaiters") or [] if w["node"] == "node-b"], own_b)

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
        self.assertNotIn('slotbroker_backend_up{pool="local"}', text)
        # The round trips as a histogram: every call counted, in its +Inf bucket too.
        self.assertIn("# TYPE slotbroker_backend_rtt_seconds histogram", text.splitlines())
        count = re.search(r'^slotbroker_backend_rtt_seconds_count\{pool="shared"\} (\d+)$', text, re.M)
        inf = re.search(r'^slotbroker_backend_rtt_seconds_bucket\{pool="shared",le="\+Inf"\} (\d+)$', text, re.M)
        self.assertTrue(count and inf, text)
        self.assertGreater(int(count[1]), 0)
        self.assertEqual(inf[1], count[1])
        self.assertRegex(text, r'(?m)^slotbroker_backend_rtt_seconds_sum\{pool="shared"\} [0-9.e+-]+$')

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

    def test_queue_order_across_nodes(self):
        a = self.broker(config(self.redis.url(), "node-a"), "order-a")
        b = self.broker(config(self.redis.url(), "node-b"), "order-b")
        h1 = self.first_grant(a)
        h2 = self.granted_in_time(a, "ci", 10)
        self.wait_backend_up(b)

        # One queue for both nodes: B's request for both slots first, then A's for one, then B's of lane hi
        # (priority 10), which goes ahead of both.
        big = self.acquire(b, "ci", slots=2)
        self.assertTrue(big.queued, big.msg)
        small = self.acquire(a, "ci")
        self.assertTrue(small.queued, small.msg)
        first = self.acquire(b, "hi")
        self.assertTrue(first.queued, first.msg)
        self.assertEqual([x.params.get("position") for x in (big, small, first)], [1, 2, 1])

        # Each node lists its own waiters at their places in the pool's queue, and the other node's by name.
        def queue():
            own_b = [(w["lane"], w["slots"], w["position"]) for w in b.status()["waiters"]]
            own_a = [(w["lane"], w["slots"], w["position"]) for w in a.status()["waiters"]]
            other_a = [(w["node"], w["lane"], w["slots"], w["position"]) for w in others(a, "otherWaiters") or []]
            seen = (own_b, own_a, sorted(other_a, key=lambda w: w[3]))
            return seen if seen == ([("hi", 1, 1), ("ci", 2, 2)], [("ci", 1, 3)],
                                    [("node-b", "hi", 1, 1), ("node-b", "ci", 2, 2)]) else None
        wait_for(queue, timeout=10, message="both nodes to show the queue hi(B), ci×2(B), ci(A)")
        # slotctl status shows them too: the backend's line, the other node's entries by its name.
        rows = self.slotctl_status(a)
        self.assertIn(["shared:", "backend", "up,", "2", "nodes,", "round", "trip"], [r[:7] for r in rows])
        self.assertIn(["3", "ci", "1", str(os.getuid())], [r[:4] for r in rows])
        self.assertIn(["1", "node-b", "hi", "1"], [r[:4] for r in rows])
        self.assertIn(["2", "node-b", "ci", "2"], [r[:4] for r in rows])
        rows = wait_for(lambda: [r for r in self.slotctl_status(b) if r[:1] == ["node-a"]], timeout=10,
                        message="B's slotctl status to list A's holders")
        self.assertEqual(sorted((r[1], r[3]) for r in rows), sorted(("ci", str(h.lease["token"])) for h in (h1, h2)))

        # A frees a slot: B's priority waiter gets it (hand-on A → B). The two-slot waiter still lacks one.
        slot = h1.lease["slots"][0]
        h1.close()
        first.until_granted(timeout=10)
        self.assertEqual(first.lease["slots"], [slot])
        self.assertGreater(first.lease["token"], max(h1.lease["token"], h2.lease["token"]))

        # A frees the other: one slot free, and A's one-slot waiter is behind the two-slot one: it must not
        # pass it. Wait until B's snapshot shows the release applied (no holder of A's left: a barging grant
        # would be one).
        h2.close()
        wait_for(lambda: not others(b, "otherHolders"), timeout=10,
                 message="B to see A hold nothing (a grant that passed the two-slot waiter would be A's)")
        self.assertFalse(any(m.get("parameters", {}).get("state") == "granted" for m in self.arrived(small)),
                         "a one-slot waiter passed the two-slot waiter ahead of it")

        # B's priority holder ends: two free, the two-slot waiter gets both, and A's waiter still waits.
        first.close()
        big.until_granted(timeout=10)
        self.assertEqual(sorted(big.lease["slots"]), [0, 1])
        self.assertFalse(any(m.get("parameters", {}).get("state") == "granted" for m in self.arrived(small)))
        # Then it is A's turn (hand-on B → A), with a token above every earlier one.
        big.close()
        small.until_granted(timeout=10)
        self.assertGreater(small.lease["token"], big.lease["token"])

    def test_restart_within_ttl_keeps_the_lease_beyond_it_fences(self):
        ttl = 10  # fence at 7 s after the last heartbeat: a restart and a reclaim fit in it on a loaded machine
        a = self.broker(config(self.redis.url(), "node-a", limit=1, ttl=ttl), "restart-a")
        b = self.broker(config(self.redis.url(), "node-b", limit=1, ttl=ttl), "restart-b")
        self.wait_backend_up(a)
        w = Witness(self.tmp)

        def run(broker, name):
            p = subprocess.Popen([SLOTCTL, "run", "--socket", broker.socket_path, "--lane", "ci", "--job", name,
                                  "--quiet", "--", *w.command_until_stopped(name)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            self.addCleanup(end, p, name)
            return p

        def end(p, name):
            w.stop(name)  # the command, should the test have failed before it ended
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            p.stderr.close()

        held = run(a, "held")
        [start] = wait_for(lambda: w.started("held"), timeout=ttl + 20, message="the first grant (one TTL)")
        # Killed and started again at once: slotctl reclaims the lease, the command runs on, same token.
        a.crash()
        crashed = time.monotonic()
        a.start()

        def reclaimed():
            hs = [h for h in a.status()["holders"] if h["lease"]["token"] == start.token and h["state"] == "held"]
            return hs or None
        wait_for(reclaimed, timeout=ttl, message="slotctl to reclaim its lease with the same token")
        self.wait_backend_up(a)
        # Past the TTL since the crash: node-a is still alive in Redis, holding the same token, and nothing of
        # the command's changed (polled throughout: an expiry in between would show as B's holder gone).
        self.wait_backend_up(b)
        while time.monotonic() < crashed + ttl + 1:
            held_elsewhere = others(b, "otherHolders") or []
            self.assertIsNone(held.poll(), held.stderr.read() if held.poll() is not None else "")
            self.assertEqual(w.ended("held"), [])
            if held_elsewhere:
                self.assertEqual([(h["node"], h["token"]) for h in held_elsewhere], [("node-a", start.token)])
            time.sleep(0.2)
        self.assertEqual([(h["node"], h["token"]) for h in wait_for(lambda: others(b, "otherHolders"), timeout=5)],
                         [("node-a", start.token)])
        w.stop("held")
        self.assertEqual(held.wait(10), 0, held.stderr.read())

        # Killed for longer than the TTL: slotctl fences its command (exit 124) before Redis frees the slot for
        # B's waiter; the witness sees the two commands one after the other, tokens increasing.
        fenced = run(a, "fenced")
        [start] = wait_for(lambda: w.started("fenced"), timeout=10, message="A's second grant")
        waiter = run(b, "after")
        wait_for(lambda: [x for x in b.status()["waiters"]], timeout=10, message="B's waiter queued")
        a.crash()
        crashed = time.monotonic()
        self.assertEqual(fenced.wait(ttl + 10), 124, fenced.stderr.read())
        # At the last renewal's deadline: the last acknowledged heartbeat (before the crash) + TTL − margin.
        fenced_after = time.monotonic() - crashed
        self.assertLessEqual(fenced_after, ttl - MARGIN + harness.LATENESS, "slotctl fenced its command late")
        [after] = wait_for(lambda: w.started("after"), timeout=ttl + 10, message="B's waiter granted the slot")
        self.assertGreater(after.token, start.token)
        # Started again after more than the TTL: the lease is gone in Redis, and from A (revoked, not held).
        a.start()
        self.wait_backend_up(a)
        wait_for(lambda: not [h for h in a.status()["holders"] if h["lease"]["token"] == start.token],
                 timeout=10, message="A to drop the lease Redis freed")
        w.stop("after")
        self.assertEqual(waiter.wait(10), 0, waiter.stderr.read())
        w.check_shared(self, {"shared": 1})

    def test_a_status_whose_client_shut_its_sending_side_is_answered(self):
        """A shared pool's Status waits for a snapshot of the other nodes fetched after the call came. A client
        that shut its sending side after the call (`printf … | socat`) still gets the reply, then the end of the
        connection, as from a local pool: the connection was closed as one with nothing left to answer."""
        a = self.broker(config(self.redis.url(), "node-a"), "shut-a")
        self.wait_backend_up(a)
        for _ in range(5):  # each a Status that waits: a fetch is asked for after each call
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(10)
                s.connect(a.socket_path)
                s.sendall(harness.Varlink.encode_call("io.slotbroker.Status"))
                s.shutdown(socket.SHUT_WR)
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
            self.assertTrue(data.endswith(b"\0"), f"no reply: {data!r}")
            self.assertIn("shared", [p["name"] for p in json.loads(data[:-1])["parameters"]["pools"]])

    def test_status_after_a_quiet_spell_shows_the_other_nodes_as_they_are(self):
        """A's Status lists B's lease; nobody asks A for 30 s (its snapshot fetches stop), then B's lease
        ends. The first Status on A right after no longer lists it (the reply waited for a fetch asked
        for after the call), and says how old its view is (backend.snapshotAgeMs, slotctl's "as of")."""
        a = self.broker(config(self.redis.url(), "node-a"), "quiet-a")
        b = self.broker(config(self.redis.url(), "node-b"), "quiet-b")
        held = self.first_grant(b)
        token = held.lease["token"]
        self.wait_backend_up(a)
        wait_for(lambda: [h for h in others(a, "otherHolders") or [] if h["token"] == token] or None, timeout=10,
                 message="A's Status to list B's lease")
        # The quiet spell is the case itself: A's fetches stop SHARED_STATUS_KEEP (30 s) after its last
        # Status, and nothing outside can tell when.
        time.sleep(32)
        held.close()
        wait_for(lambda: b.pool("shared")["backend"]["inUse"] == 0, timeout=10, message="B's release in Redis")
        st = a.status()
        self.assertEqual([h for h in st.get("otherHolders") or [] if h["token"] == token], [],
                         "A's first Status after a quiet spell lists a lease B has released")
        age = a.pool("shared", st)["backend"].get("snapshotAgeMs")
        self.assertIsInstance(age, int, a.pool("shared", st))
        self.assertLess(age, 1000 + harness.LATENESS * 1000)
        line = [w for w in self.slotctl_status(a) if w[:3] == ["shared:", "backend", "up,"]]
        self.assertEqual(len(line), 1, line)
        self.assertRegex(" ".join(line[0]), r"other nodes as of \d+\.\d s ago$")

    def test_drain_on_one_node_refuses_the_other_nodes_waiters(self):
        a = self.broker(config(self.redis.url(), "node-a", limit=1), "drain-a")
        b = self.broker(config(self.redis.url(), "node-b", limit=1), "drain-b")
        held = self.first_grant(a)
        self.wait_backend_up(b)
        waiter = self.acquire(b, "ci")
        self.assertTrue(waiter.queued, waiter.msg)

        # The pool's queue is Redis's: a drain from A refuses B's waiter, and B refuses new requests.
        a.call("io.slotbroker.Drain", {"pool": "shared", "on": True})
        waiter.until(lambda x: x.error, timeout=10, what="B's waiter refused")
        self.assertEqual(waiter.error, "io.slotbroker.Unavailable", waiter.msg)
        self.assertEqual((waiter.params.get("pool"), waiter.params.get("reason")), ("shared", "drained"), waiter.msg)
        self.assertIsInstance(waiter.params.get("retryAfterSec"), int)
        refused = self.acquire(b, "ci")
        self.assertEqual((refused.error, refused.params.get("reason")), ("io.slotbroker.Unavailable", "drained"),
                         refused.msg)
        wait_for(lambda: b.pool("shared")["drained"], timeout=10, message="B's Status to say drained")
        # The holder is not disturbed.
        ended = [m for m in self.arrived(held) if "error" in m or m.get("parameters", {}).get("state") == "revoked"]
        self.assertEqual(ended, [], "a drain ended a lease")

        # Undrained from B: B's requests wait again, and get the slot A frees.
        b.call("io.slotbroker.Drain", {"pool": "shared", "on": False})
        again = self.acquire(b, "ci")
        self.assertTrue(again.queued, again.msg)
        wait_for(lambda: not a.pool("shared")["drained"], timeout=10, message="A's Status to say undrained")
        held.close()
        again.until_granted(timeout=10)

    def test_pool_added_by_reload_is_served_while_the_read_blocks(self):
        url = self.redis.url()
        a = self.broker(config(url, "node-a"), "reload-a")
        b = self.broker(config(url, "node-b", more=extra_pool(url)), "reload-b")
        wait_for(lambda: b.pool("extra")["backend"]["up"], timeout=30, message="B: extra's backend up")
        held = self.granted_in_time(b, "x", TTL + 20)
        # A reads the stream of its only pool, blocked (nothing happens in it) when the new pool comes.
        self.wait_backend_up(a)
        a.write_config(config(url, "node-a", more=extra_pool(url)))
        reloaded = time.monotonic()
        a.reload()
        wait_for(lambda: a.pool("extra")["backend"]["up"], timeout=5 + harness.LATENESS,
                 message="A: extra's backend up")
        waiter = self.acquire(a, "x")
        self.assertTrue(waiter.queued, waiter.msg)
        # B's release grants A's waiter in Redis; the grant reaches A through its stream of the new pool (or,
        # should that read not include it yet, the next heartbeat's reconcile).
        released = time.monotonic()
        held.close()
        waiter.until_granted(timeout=5 + harness.LATENESS)
        print(f"reload to served: {released - reloaded:.3f} s; hand-on B → A: {time.monotonic() - released:.3f} s",
              file=sys.stderr)

    def test_check_config_prints_the_keys(self):
        password = os.path.join(self.tmp, "password")
        with open(password, "w") as f:
            f.write("secret\n")
        b = harness.Broker(config(self.redis.url(), "runner-7",
                                  extra=f"backend-user = ci\nbackend-password-file = {password}\n"),
                           name="shared-check")
        self.addCleanup(b.cleanup)
        out = b.check_config()
        self.assertEqual(out.returncode, 0, out.stderr)
        for line in ("node-name=runner-7", "backend-user=ci", f"backend-password-file={password}",
                     f"backend-node-ttl={TTL}s"):
            self.assertIn(line, out.stdout.splitlines())

        # A TTL that leaves no heartbeat window once the fence margin is taken off is refused.
        b.write_config(config(self.redis.url(), "runner-7").replace(f"backend-node-ttl = {TTL}s",
                                                                     "backend-node-ttl = 3s"))
        out = b.check_config()
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
            return config(self.redis.url(), node, ttl=ttl)
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


# The journal entries of shared pools: the tag opening MESSAGE, and words of their catalog entry's Subject.
NOTICES = {
    "BACKEND_LOST": "lost its backend",
    "BACKEND_REGAINED": "reached its backend again",
    "BACKEND_RECOVERY": "recovery window",
    "RULES_MISMATCH": "rules differ",
    "NODE_EXPIRED": "node @SLOT_NODE@ expired",
    "BACKEND_FENCED": "leases revoked",
}


class TestSharedJournal(SharedTestCase):
    """Only inside journald-ns.sh (meson's test-shared-journal): a SKIP elsewhere."""

    catalog = None

    @classmethod
    def setUpClass(cls):
        journal.require_private_journald()
        cls.catalog = journal.read_catalog(CATALOG)

    def setUp(self):
        super().setUp()
        self.ids = {}

    def notice(self, tag, broker, *matches, n=1, timeout=TTL + 20):
        """Waits for n entries of brokerd `broker` tagged `tag` about pool shared; checks their MESSAGE_ID (one
        per tag, in the catalog, whose Subject is about it) and returns them."""
        def found():
            es = [e for e in journal.entries("SLOT_POOL=shared", f"_PID={broker.pid}", *matches)
                  if e.get("MESSAGE", "").startswith(f"[{tag}] ")]
            return es if len(es) >= n else None
        es = wait_for(found, timeout=timeout, interval=0.1, message=f"{n} journal entries [{tag}] of {broker.name}")
        for e in es:
            mid = e.get("MESSAGE_ID")
            self.assertIn(mid, self.catalog, f"[{tag}] entry's MESSAGE_ID is not in the catalog: {e}")
            self.assertIn(NOTICES[tag], self.catalog[mid], f"catalog entry {mid} is not about [{tag}]")
            self.assertEqual(self.ids.setdefault(tag, mid), mid, f"[{tag}] entries with two MESSAGE_IDs")
            self.assertEqual(e.get("SYSLOG_IDENTIFIER"), "brokerd")
        return es

    def test_backend_notices_with_their_message_ids(self):
        url = self.redis.url()
        a = self.broker(config(url, "node-a"), "journal-a")
        b = self.broker(config(url, "node-b"), "journal-b", clean_exit=False)  # killed below
        # The first use of the pool: a recovery window (no node can tell a new pool from a lost one), told of
        # by each node that sees it.
        held_b = self.first_grant(b)
        self.notice("BACKEND_RECOVERY", a)
        self.notice("BACKEND_RECOVERY", b)

        # A third node with another limit is refused, and says which key differs.
        c = self.broker(config(url, "node-c", limit=3), "journal-c")
        [e] = self.notice("RULES_MISMATCH", c)
        self.assertEqual(e.get("SLOT_DETAIL"), "limit", e)
        self.assertEqual(e.get("PRIORITY"), "3", e)
        backend = wait_for(lambda: c.pool("shared")["backend"].get("differingKeys") and c.pool("shared")["backend"],
                           timeout=10, message="C's Status to name the differing keys")
        self.assertEqual((backend["unavailable"], backend["differingKeys"]), ("rules", ["limit"]))
        # Its Status counts the pool against the limit Redis enforces, not its own, and says both; its metric
        # counts the pool's slots as Redis does.
        self.assertEqual((c.pool("shared")["limit"], backend.get("limit")), (3, 2), backend)
        self.assertIn('slotbroker_slots{pool="shared"} 2', c.call("io.slotbroker.Metrics")["text"].splitlines())
        rows = self.slotctl_status(c)
        self.assertIn("1/2", [r for r in rows if r[:1] == ["shared"]][0], rows)
        self.assertIn("the agreed limit is 2, this node's 3".split(),
                      [r[-8:] for r in rows if r[:2] == ["shared:", "refused"]], rows)
        c.stop()

        # B dies holding a slot: after its TTL one live node frees it and says so, naming it.
        b.crash()
        held_b.close()
        expired = wait_for(lambda: [e for e in journal.entries("SLOT_POOL=shared", "SLOT_NODE=node-b")
                                    if e.get("MESSAGE", "").startswith("[NODE_EXPIRED] ")] or None,
                           timeout=TTL + 20, interval=0.1, message="the journal entry of node-b's expiry")
        self.assertEqual(len(expired), 1, f"node-b's expiry journaled by more than one node: {expired}")
        observer = a if expired[0]["_PID"] == str(a.pid) else c
        [e] = self.notice("NODE_EXPIRED", observer, "SLOT_NODE=node-b")
        self.assertIn("its 1 leases", e["MESSAGE"])

        # Redis dies while A holds a slot: backend lost at once; the lease revoked at the self-fence deadline.
        held_a = self.granted_in_time(a, "ci", 10)
        self.redis.kill9()
        [lost] = self.notice("BACKEND_LOST", a)
        self.assertEqual(lost.get("PRIORITY"), "4", lost)
        self.notice("BACKEND_FENCED", a, timeout=TTL + 10)
        held_a.until(lambda x: x.state == "revoked" or x.error, timeout=10, what="A's lease revoked")

        # Redis back, empty (a new run id): regained, and a recovery window while the live nodes reclaim.
        self.redis.restart(keep_data=False)
        self.notice("BACKEND_REGAINED", a)
        # Once per window, though A both saw Redis's new run id and the window in the reply's cache.
        self.assertEqual(len(self.notice("BACKEND_RECOVERY", a, n=2)), 2)
        tags = {mid: tag for tag, mid in self.ids.items()}
        self.assertEqual(len(tags), len(NOTICES), f"two kinds of entries share a MESSAGE_ID: {self.ids}")


if __name__ == "__main__":
    (_, SLOTCTL, CATALOG), argv = harness.arguments(__doc__, 3)
    harness.main(argv)
