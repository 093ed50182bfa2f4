#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""One Sentinel of three names another primary than the other two (SPEC §11 "High availability";
brokerd.conf(5), "High availability: Redis Sentinel"): the primary it names is not confirmed, and brokerd
stops asking it.

Two real redis-servers A and B and three fake Sentinels (fakeredis.py: they answer INFO as a Sentinel,
SENTINEL get-master-addr-by-name from a table the test changes, SUBSCRIBE, and publish +switch-master when
told). Brokerd Y uses A directly (redis://); brokerd X asks the Sentinels; both have the one-slot pool
`shared`.

1. All three Sentinels name B: X is confirmed on B, waits out B's first-use recovery window and takes and
   gives back the slot there. Y takes the slot on A and holds it to the end.
2. All three name A: the rounds move X there (once B's confirmation is stale) and confirm it; X holds
   nothing then, so a waiter wakes its rounds (they rest on an idle node).
3. Sentinel 0 (the one X asks and watches) alone names B and publishes +switch-master to it: X follows it
   at once, while the confirmation of A is fresh. X asks for the slot all along (on the waiting lane, again
   whenever refused): it must never be granted (B would grant it: Y holds the only slot on A, B knows nothing
   of it). X's Status names B without a confirmation, the pool refused "unconfirmed". Before the fix X
   counted A's confirmation for B and took a grant from B within milliseconds of reaching it.
4. The rounds take X back to A 3 s after A's last confirmation, and X asks another Sentinel from then on:
   Sentinel 0, which still names B, moves it no more (before, every reconnection asked it again, and X
   went to B and back by turns). X's request waits behind Y's lease on A and is granted when Y lets go.

A SKIP (77) without redis-server or shared pools. About 20 s; it times nothing but waits for rounds (1 s)
and confirmations going stale (3 s): never in parallel.

Usage: test-sentinel-lone.py BROKERD SLOTCTL [unittest arguments]
"""
import shutil
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
from fakeredis import FakeRedis, array, bulk, integer, status  # noqa: E402
from harness import wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402

SLOTCTL = None
TTL = 6  # backend-node-ttl's least with revoke-grace 1 s: B's first-use recovery window is short
MASTER = "mymaster"
INFO = "# Server\r\nredis_version:7.0.15\r\nredis_mode:sentinel\r\nrun_id:%s\r\n"


class FakeSentinel:
    """A Sentinel that names 127.0.0.1:self.port_named as MASTER's primary (changed by the test)."""

    def __init__(self, index, port):
        self.port_named = port
        self.lock = threading.Lock()
        self.subscribers = []
        run_id = chr(ord("a") + index) * 40
        self.fake = FakeRedis(lambda fake, c, args: self.answer(c, args, run_id))
        self.port = self.fake.port

    def name(self, port, publish=False):
        """Names 127.0.0.1:port from now on; publish: and says so on +switch-master, as a failover would."""
        with self.lock:
            old, self.port_named = self.port_named, port
            if publish:
                message = f"{MASTER} 127.0.0.1 {old} 127.0.0.1 {port}"
                for c in self.subscribers:
                    try:
                        c.send(array(bulk("message"), bulk("+switch-master"), bulk(message)))
                    except OSError:
                        pass

    def answer(self, c, args, run_id):
        name = args[0].upper()
        if name == b"INFO":
            return bulk(INFO % run_id)
        if name == b"SENTINEL" and len(args) == 3 and args[1].lower() == b"get-master-addr-by-name":
            if args[2].decode() != MASTER:
                return bulk(None)
            with self.lock:
                return array(bulk("127.0.0.1"), bulk(str(self.port_named)))
        if name == b"SUBSCRIBE":
            with self.lock:
                c.send(array(bulk("subscribe"), bulk(args[1]), integer(1)))
                self.subscribers.append(c)
            return None
        return status("OK")

    def close(self):
        self.fake.close()


class LoneSentinel(harness.BrokerTestCase):

    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-sentinel-lone-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.a = RedisServer(self.tmp, unix=False, name="A").start()
        self.addCleanup(self.a.close)
        self.b = RedisServer(self.tmp, unix=False, name="B").start()
        self.addCleanup(self.b.close)
        self.sentinels = [FakeSentinel(i, self.b.port) for i in range(3)]
        for s in self.sentinels:
            self.addCleanup(s.close)

    def backend(self, broker):
        return broker.pool("shared")["backend"]

    def take_slot(self, broker, timeout):
        """Asks on the waiting lane until granted (a pool's first use waits out its recovery window; a
        request is refused while the pool is not served yet)."""
        deadline = time.monotonic() + timeout
        while True:
            a = self.acquire(broker, "ci")
            a.until(lambda a: a.granted or a.error, timeout=max(deadline - time.monotonic(), 0.1),
                    what=f"{broker.name}'s grant")
            if a.granted:
                return a
            a.close()
            self.assertLess(time.monotonic(), deadline, f"{broker.name} never got the slot: {a.msg!r}")
            wait_for(lambda: self.backend(broker).get("up"), timeout=deadline - time.monotonic(),
                     message=f"{broker.name}'s pool served")

    def test_a_primary_one_sentinel_names_is_not_confirmed(self):
        a_primary, b_primary = f"127.0.0.1:{self.a.port}", f"127.0.0.1:{self.b.port}"
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        x = self.broker(harness.shared_pool_config(f"redis-sentinel://{hosts}/{MASTER}", "x", TTL), "X")
        y = self.broker(harness.shared_pool_config(self.a.url(0, tcp=True), "y", TTL), "Y")

        # 1. X on B, confirmed; B's recovery window over (X took the slot there). Y holds the slot on A.
        wait_for(lambda: self.backend(x).get("primary") == b_primary and "confirmedAgoMs" in self.backend(x),
                 timeout=20, message="X confirmed on B")
        self.take_slot(x, TTL + 20).close()
        held = self.take_slot(y, TTL + 20)

        # 2. All name A: the rounds move X there once B's confirmation is stale. X holds nothing: its rounds rest
        #    until a request wakes them (a waiter here, queued behind Y's lease once on A, withdrawn after).
        f0 = self.backend(x)["failovers"]
        wait_for(lambda: self.backend(x).get("confirmedAgoMs", 0) > 3500, timeout=20,
                 message="B's confirmation stale (X's rounds rest)")
        for s in self.sentinels:
            s.name(self.a.port)
        waking = x.acquire("ci")
        wait_for(lambda: self.backend(x)["failovers"] == f0 + 1 and "confirmedAgoMs" in self.backend(x),
                 timeout=20, message="X moved to A by the rounds and confirmed there")
        waking.close()

        # 3. Sentinel 0 alone moves X to B, while A's confirmation is fresh.
        self.sentinels[0].name(self.b.port, publish=True)
        ask = None
        seen_on_b = set()  # X's pool's refusal reasons while on B, after Sentinel 0 moved it there
        confirmed_b = None  # X's Status saying B confirmed then
        deadline = time.monotonic() + 30
        # Until the rounds took X back to A: X was on B for up to 3 s.
        while True:
            backend = self.backend(x)
            if backend["failovers"] >= f0 + 3:
                break
            self.assertLess(time.monotonic(), deadline, f"X's failovers {backend!r}")
            if backend.get("primary") == b_primary and backend["failovers"] == f0 + 2:
                seen_on_b.add(backend.get("unavailable"))
                if "confirmedAgoMs" in backend:
                    confirmed_b = backend
            if ask is None:
                ask = x.acquire("ci")  # with its first reply
            elif (msg := ask.conn.poll(0.05)) is not None:
                ask.msg = msg
            else:
                continue
            self.assertFalse(ask.granted, f"X granted ({ask.msg!r}) while Y holds the only slot on A; X's Status: "
                             f"{backend!r}; X's journal:\n{x.log()[-3000:]}")
            if ask.error:
                ask.close()
                ask = None
        self.assertIsNone(confirmed_b, "B, named by one Sentinel of three, confirmed")
        self.assertIn("unconfirmed", seen_on_b, "X's pool never seen registered on B and refused for it")
        self.assertTrue(held.conn.poll(0) is None and y.pool("shared")["inUse"] == 1, "Y's lease ended")

        # 4. Back on A, asking another Sentinel: served there, Sentinel 0 still naming B.
        if ask is not None:
            ask.close()
        deadline = time.monotonic() + 20
        while True:
            wait_for(lambda: self.backend(x).get("up"), timeout=max(deadline - time.monotonic(), 0.1),
                     message="X served on A")
            ask = self.acquire(x, "ci")
            self.assertFalse(ask.granted, f"X granted on A while Y holds the slot: {ask.msg!r}")
            if ask.queued:
                break
            ask.close()  # refused: the pool stopped serving between Status and the request
            self.assertLess(time.monotonic(), deadline, f"X's request on A: {ask.msg!r}")
        held.close()
        ask.until_granted(timeout=20)
        backend = self.backend(x)
        self.assertEqual((backend["primary"], backend["failovers"]), (a_primary, f0 + 3),
                         f"X did not stay on A: {backend!r}")
        self.assertIn(f"Sentinel 127.0.0.1:{self.sentinels[0].port} names {b_primary}", x.log())

if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
