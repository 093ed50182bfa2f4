#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A hostile environment for shared pools (issue 19 g, h; SPEC §11 "Nothing from outside is trusted").

Each case runs one brokerd with a shared pool `shared` (lane `shared`) and a local pool `local` (lane
`local`), and makes whatever answers at the shared pool's backend hostile:

With a fake Redis (fakeredis.py):
- a bulk string announced as 2 GB at connect, then 256 MiB of it sent as fast as loopback goes: brokerd's
  peak RSS (VmHWM) grows by less than 48 MiB, the pool is refused "reply-too-large" (issue 19 h); the same
  from each of three Sentinels of a redis-sentinel:// backend;
- an array announced with 2^31 - 1 elements as a script's answer: the same;
- malformed RESP, arrays nested 64 deep, a reply dripped a byte every 100 ms: refused, not stalled;
- a script answering with another shape or another rid's grant (slots beyond the limit), and XREAD
  answering with entries of requests this node never sent: the request is refused "bad-reply", the
  input counted (slotbroker_backend_bad_input_total).
With a real redis-server, entries written into this node's stream by someone with the password:
- a grant of the queued request's rid whose slot list is far longer than its member list (issue 19 g:
  lease_new() read past the members and brokerd crashed), slots out of range, token 0, 2^53 and
  negative, a huge field, a rid never sent: brokerd lives, the waiter is refused "bad-reply", the holder
  keeps its slot and nobody else gets it, the bad input is counted and journaled once.
Every case: brokerd answers, its local pool grants at once.

Usage: test-shared-untrusted.py BROKERD [unittest arguments]
"""
import os
import shutil
import sys
import tempfile
import time
import unittest

sys.dont_write_bytecode = True
import faults  # noqa: E402
import fakeredis  # noqa: E402
import harness  # noqa: E402
from fakeredis import FakeRedis  # noqa: E402
from harness import wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402

MIB = 1024 * 1024

# Peak RSS is measured: under AddressSanitizer, its quarantine (256 MiB by default) keeps every freed reply
# buffer resident, and the Sentinels' five links reconnect with a fresh one each time. A small quarantine
# measures what brokerd itself holds.
if "quarantine_size_mb" not in os.environ.get("ASAN_OPTIONS", ""):
    os.environ["ASAN_OPTIONS"] = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"), "quarantine_size_mb=1"]))


def config(backend, limit=1, members=None, ttl=None):
    """ttl: a short backend-node-ttl (s), with the revoke-grace that keeps it valid: the recovery window of a
    real Redis's first use is one TTL (30 s by default)."""
    m = f"members = {' '.join(members)}\n" if members else ""
    if ttl:
        m += f"backend-node-ttl = {ttl}s\n"
    broker = "[broker]\nrevoke-grace = 1s\n\n" if ttl else ""
    return f"""\
{broker}[pool shared]
limit = {limit}
backend = {backend}
{m}
[pool local]
limit = 1

[lane shared]
pools = shared

[lane local]
pools = local
policy = fail-fast
"""


def vm_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def bad_input_total(b):
    for line in b.call("io.slotbroker.Metrics")["text"].splitlines():
        if line.startswith('slotbroker_backend_bad_input_total{pool="shared"}'):
            return int(line.split()[-1])
    return None


class Hostile(harness.BrokerTestCase):
    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-untrusted-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def fake(self, behaviour):
        f = FakeRedis(behaviour)
        self.addCleanup(f.close)
        return f

    def assert_local_serves(self, b):
        start = time.monotonic()
        a = self.acquire(b, "local")
        self.assertTrue(a.granted, a.msg)
        self.assertLessEqual(time.monotonic() - start, harness.LATENESS, "the local pool answered late")
        a.close()
        wait_for(lambda: b.pool("local")["inUse"] == 0, message="local's slot released")

    def wait_unavailable(self, b, reason, timeout=20):
        wait_for(lambda: b.pool("shared")["backend"].get("unavailable") == reason, timeout=timeout,
                 message=f"the shared pool refused, {reason}")

    # ---- issue 19 h: unbounded replies ----

    def test_huge_bulk_at_connect(self):
        def behaviour(fake, c, args):
            # 2 GB announced, 256 MiB sent: as much as a real attack would before the deadline.
            c.flood(b"$2000000000\r\n", 256 * MIB)
            return FakeRedis.CLOSE
        f = self.fake(behaviour)
        b = self.broker(config(f.url()), "huge-bulk")
        before = vm_kib(b.pid, "VmHWM")
        self.wait_unavailable(b, "reply-too-large")
        grown = (vm_kib(b.pid, "VmHWM") - before) // 1024
        self.assertLess(grown, 48, f"brokerd's peak RSS grew by {grown} MiB")
        self.assertLess(f.connections[0].sent, 64 * MIB, "brokerd read on past the cap")
        self.assert_local_serves(b)

    def test_huge_bulk_from_the_sentinels(self):
        def behaviour(fake, c, args):
            c.flood(b"$2000000000\r\n", 128 * MIB)
            return FakeRedis.CLOSE
        sentinels = [self.fake(behaviour) for _ in range(3)]
        hosts = ",".join(f"127.0.0.1:{f.port}" for f in sentinels)
        b = self.broker(config(f"redis-sentinel://{hosts}/mymaster"), "huge-sentinel")
        before = vm_kib(b.pid, "VmHWM")
        wait_for(lambda: sum(len(f.connections) for f in sentinels) >= 3, timeout=20,
                 message="brokerd to ask every Sentinel")
        wait_for(lambda: all(c.sent > 0 for f in sentinels for c in f.connections), timeout=20,
                 message="every Sentinel's flood")
        wait_for(lambda: all(c.ended for f in sentinels for c in f.connections), timeout=20,
                 message="brokerd to hang up on every flood")
        grown = (vm_kib(b.pid, "VmHWM") - before) // 1024
        self.assertLess(grown, 48, f"brokerd's peak RSS grew by {grown} MiB")
        for f in sentinels:
            for c in f.connections:
                self.assertLess(c.sent, 64 * MIB, "brokerd read on past the cap")
        # Fail-fast, as in hostile_script_answer(): a request that may wait is held for the waiter grace (5 s
        # from brokerd's start), the client's own timeout here, and its refusal raced the client's wait.
        a = self.acquire(b, "shared", wait=False)
        self.assertEqual(a.error, "io.slotbroker.Unavailable", a.msg)
        self.assert_local_serves(b)

    def test_huge_array_as_a_scripts_answer(self):
        def behaviour(fake, c, args):
            out = fakeredis.setup_ok(fake, c, args)
            if out is not None:
                return out
            c.send(b"*2147483647\r\n")
            c.flood(b"", 256 * MIB)  # "0000…": one integer-less line, read as the elements come
            return FakeRedis.CLOSE
        f = self.fake(behaviour)
        b = self.broker(config(f.url()), "huge-array")
        before = vm_kib(b.pid, "VmHWM")
        self.wait_unavailable(b, "reply-too-large")
        grown = (vm_kib(b.pid, "VmHWM") - before) // 1024
        self.assertLess(grown, 48, f"brokerd's peak RSS grew by {grown} MiB")
        self.assert_local_serves(b)

    def test_many_small_values(self):
        def behaviour(fake, c, args):
            out = fakeredis.setup_ok(fake, c, args)
            if out is not None:
                return out
            # Arrays of 100000 integers nested: each array under the cap, the reply far over it.
            c.send(b"*1000\r\n")
            for _ in range(1000):
                if fake.closed:
                    break
                c.send(b"*100000\r\n" + b":1\r\n" * 100000)
            return FakeRedis.CLOSE
        f = self.fake(behaviour)
        b = self.broker(config(f.url()), "many-values")
        before = vm_kib(b.pid, "VmHWM")
        self.wait_unavailable(b, "reply-too-large")
        grown = (vm_kib(b.pid, "VmHWM") - before) // 1024
        self.assertLess(grown, 64, f"brokerd's peak RSS grew by {grown} MiB")
        self.assert_local_serves(b)

    # ---- RESP spoken badly or slowly ----

    def hostile_script_answer(self, answer, reason=None, name="hostile"):
        def behaviour(fake, c, args):
            out = fakeredis.setup_ok(fake, c, args)
            if out is not None:
                return out
            if callable(answer):
                answer(fake, c, args)
                return FakeRedis.CLOSE
            return answer
        f = self.fake(behaviour)
        b = self.broker(config(f.url()), name)
        wait_for(lambda: f.count("FCALL") > 0, timeout=20, message="a script call")
        if reason:
            self.wait_unavailable(b, reason)
        self.assertTrue(b.alive())
        # Fail-fast: a request that may wait is held for the pool's first registration, the waiter grace (5 s),
        # which this Redis never lets happen; one that may not is refused at once.
        a = self.acquire(b, "shared", wait=False)
        self.assertEqual(a.error, "io.slotbroker.Unavailable", a.msg)
        self.assert_local_serves(b)
        return b, f

    def test_malformed_resp(self):
        self.hostile_script_answer(b"*6\r\n:x\r\n", reason="not-redis", name="malformed")

    def test_deep_nesting(self):
        self.hostile_script_answer(b"*1\r\n" * 64 + b":1\r\n", reason="not-redis", name="deep")

    def test_slow_drip(self):
        body = fakeredis.tick_ok(fakeredis.now_us())
        b, f = self.hostile_script_answer(lambda fake, c, args: c.drip(body, 0.1), name="drip")
        # The loop is not held up by the drip: Status answers at once, again and again.
        for _ in range(5):
            start = time.monotonic()
            b.status()
            self.assertLess(time.monotonic() - start, 1.0)

    # ---- answers of another shape, another node's entries ----

    def test_wrong_shapes_and_entries_never_sent(self):
        forged_sent = []

        def behaviour(fake, c, args):
            out = fakeredis.setup_ok(fake, c, args)
            if out is not None:
                return out
            name, argv = fakeredis.script_of(c, args)
            now = fakeredis.now_us()
            if name == "tick":
                return fakeredis.tick_ok(now)
            if name == "submit":
                # A grant of another rid than the one submitted, of slots far beyond the limit.
                d = ["granted", "00000000deadbeef", now, 0, "", "", "none", 0, -1, 0, 0, 7,
                     list(range(1000)), []]
                return fakeredis.reply("ok", now, d)
            if name is not None:
                return fakeredis.reply("ok", now, ["gone"])
            if args[0].upper() == b"XREAD":
                if not forged_sent:
                    forged_sent.append(True)
                    key = args[-2]
                    entry = ["verdict", "granted", "rid", "00000000cafebabe", "at", str(now), "token", "9",
                             "slots", ",".join(str(i) for i in range(5000)), "members", "a"]
                    return fakeredis.encode([[key, [["1-1", entry], ["1-2", entry[:3]], ["$", entry]]]])
                time.sleep(0.2)
                return fakeredis.bulk(None)
            return fakeredis.status("OK")
        f = self.fake(behaviour)
        b = self.broker(config(f.url(), limit=1), "shapes")
        wait_for(lambda: b.pool("shared")["backend"]["up"], timeout=20, message="the shared pool up")
        wait_for(lambda: (bad_input_total(b) or 0) >= 3, timeout=20, message="the forged entries counted")
        a = self.acquire(b, "shared")
        self.assertEqual(a.error, "io.slotbroker.Unavailable", a.msg)
        self.assertEqual(a.params.get("reason"), "bad-reply")
        self.assertGreaterEqual(bad_input_total(b), 4)
        self.assertEqual(b.pool("shared")["inUse"], 0)
        self.assertIn("BACKEND_BAD_INPUT", b.log())
        self.assert_local_serves(b)

    # ---- issue 19 g: forged stream entries in a real Redis ----

    def test_forged_stream_entries_in_a_real_redis(self):
        r = RedisServer(self.tmp).start()
        self.addCleanup(r.close)
        b = self.broker(config(r.url(0), limit=1, members=["a"], ttl=6), "forged")
        # A pool's first use waits out a recovery window (one node TTL, short here): until the holder is granted.
        holder = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            holder = self.acquire(b, "shared", wait=False)
            if holder.granted:
                break
            holder.close()
            time.sleep(0.5)
        self.assertTrue(holder is not None and holder.granted, holder.msg if holder else None)
        with open(os.path.join(b.state_dir, "node-id")) as f:
            node = f.read().strip()
        stream = "{sb:shared}:s:" + node
        held = set(r.call("ZRANGE", "{sb:shared}:nr:" + node, 0, -1))
        waiter = self.acquire(b, "shared")
        self.assertTrue(waiter.queued, waiter.msg)
        rids = sorted(set(r.call("ZRANGE", "{sb:shared}:nr:" + node, 0, -1)) - held)
        self.assertEqual(len(rids), 1, (held, rids))

        def forge(rid, **fields):
            e = {"verdict": "granted", "rid": rid, "at": "1", "wait": "0", "refusal": "", "reason": "",
                 "state": "none", "idle": "0", "budget": "-1", "position": "0", "queued": "0", "token": "77",
                 "slots": "0", "members": "a"}
            e.update(fields)
            args = []
            for k, v in e.items():
                args += [k, v]
            r.call("XADD", stream, "*", *args)

        forge("00000000cafebabe")  # a rid this node never sent
        forge("00000000cafebab0", token="0")
        forge("00000000cafebab1", slots="0,1", members="a,b")
        forge("00000000cafebab2", slots="x" * (1 << 20))  # a huge field
        # The crash of issue 19 g: the queued request's rid, 1000 slots and one member.
        forge(rids[0], slots=",".join(str(i) for i in range(1000)), members="a")
        ans = waiter.next(timeout=10)
        self.assertEqual(harness.error_of(ans), "io.slotbroker.Unavailable", ans)
        self.assertEqual(ans["parameters"].get("reason"), "bad-reply")
        self.assertTrue(b.alive(), "brokerd died")
        wait_for(lambda: (bad_input_total(b) or 0) >= 5, timeout=10, message="the forged entries counted")
        # The holder still holds the only slot; nobody else got it.
        self.assertEqual(b.pool("shared")["inUse"], 1)
        other = self.acquire(b, "shared", wait=False)
        self.assertFalse(other.granted, other.msg)
        other.close()
        # Told once, not once per entry.
        self.assertEqual(b.log().count("BACKEND_BAD_INPUT"), 1, b.log()[-4000:])
        self.assert_local_serves(b)
        holder.close()


if __name__ == "__main__":
    (_,), argv = harness.arguments(__doc__, 1)
    harness.main(argv)
