#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A shared pool whose Redis is wrong (issue 11, SPEC §11): refused at once, and nothing else hurt.

Each case runs one brokerd with a shared pool `shared` (lane `shared`), a local pool `local` (lane
`local`) and a lane `both` over the two (shared first), and makes the shared pool's backend bad:
- unreachable: a closed port; a proxy that blackholes everything (connect works, nothing answers);
- a wrong password (backend-password-file=), a wrong database (/99 of 16);
- not Redis: a server answering "HTTP/1.1 400 Bad Request";
- a Redis older than 7.0 (a server answering the setup as Redis 6.2 does): no Redis Functions;
- maxmemory-policy allkeys-lru (keys that could be evicted);
- a rules mismatch: a second brokerd naming the same pool with another limit (its Status names the keys).
Every case: Acquire on `shared` gets io.slotbroker.Unavailable with retryAfterSec at once; Status answers
and says the backend is not up; `local` grants, and so does `both` (moving on past the shared pool).

The Status fields are the memo's (issue11-plan.md §1.4: pool.backend {up, unavailable, differingKeys});
reason "backend"/"rules" its Unavailable reasons. Skipped (77) with "shared pools are not built yet"
until brokerd runs a pool with backend= (faults.py), and without redis-server.

Usage: test-shared-bad-input.py BROKERD [unittest arguments]
"""
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import unittest

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
from harness import wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402
from tcpproxy import TcpProxy  # noqa: E402


def config(backend, limit=2, password_file=None, ttl=None):
    """ttl: a short backend-node-ttl (s), with the revoke-grace that keeps it valid, for a case that waits out
    the recovery window of a real Redis's first use (one TTL, 30 s by default)."""
    extra = f"backend-password-file = {password_file}\n" if password_file else ""
    if ttl:
        extra += f"backend-node-ttl = {ttl}s\n"
    broker = "[broker]\nrevoke-grace = 1s\n\n" if ttl else ""
    return f"""\
{broker}[pool shared]
limit = {limit}
backend = {backend}
{extra}
[pool local]
limit = 1

[lane shared]
pools = shared
policy = fail-fast

[lane local]
pools = local
policy = fail-fast

[lane both]
pools = shared local
policy = fail-fast
"""


OLD_REDIS_INFO = (b"# Server\r\nredis_version:6.2.14\r\nrun_id:0123456789abcdef0123456789abcdef01234567\r\n"
                  b"# Memory\r\nmaxmemory_policy:noeviction\r\n# Replication\r\nrole:master\r\n")
# SELECT's +OK, then INFO's answer: what Redis 6.2 says to brokerd's setup before FUNCTION LOAD.
OLD_REDIS = b"+OK\r\n$%d\r\n%s\r\n" % (len(OLD_REDIS_INFO), OLD_REDIS_INFO)


class NotRedis:
    """A TCP server on 127.0.0.1 that answers anything with an HTTP error and closes; or with answer, says
    that and reads until the client closes."""

    def __init__(self, answer=None):
        self.answer = answer
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                try:
                    c.settimeout(2)
                    c.recv(4096)
                    c.sendall(self.answer or b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                    while self.answer and c.recv(65536):
                        pass
                except OSError:
                    pass

    def close(self):
        self.sock.close()


class TestSharedBadInput(harness.BrokerTestCase):
    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-bad-input-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def redis(self, **kw):
        r = RedisServer(self.tmp, **kw).start()
        self.addCleanup(r.close)
        return r

    def assert_refused_at_once_and_nothing_else_hurt(self, b, reason="backend"):
        start = time.monotonic()
        a = self.acquire(b, "shared")
        elapsed = time.monotonic() - start
        self.assertEqual(a.error, "io.slotbroker.Unavailable", a.msg)
        self.assertEqual((a.params.get("pool"), a.params.get("reason")), ("shared", reason))
        self.assertIsInstance(a.params.get("retryAfterSec"), int)
        self.assertLessEqual(elapsed, harness.LATENESS, "refused, but not at once")
        pool = b.pool("shared")  # Status answers, and says why
        if reason == "backend":
            self.assertFalse(pool["backend"]["up"], pool)
        self.assertIsNotNone(pool["backend"].get("unavailable"), pool)
        local = self.acquire(b, "local")
        self.assertTrue(local.granted, local.msg)
        local.close()  # local's one slot comes back for `both`
        wait_for(lambda: b.pool("local")["inUse"] == 0, message="local's slot released")
        both = self.acquire(b, "both")
        self.assertTrue(both.granted, both.msg)
        self.assertEqual(both.lease["pool"], "local")
        both.close()
        wait_for(lambda: b.pool("local")["inUse"] == 0, message="local's slot released")
        return pool

    def test_unreachable_closed_port(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        b = self.broker(config(f"redis://127.0.0.1:{port}/0"), "closed-port")
        self.assert_refused_at_once_and_nothing_else_hurt(b)

    def test_unreachable_blackholed(self):
        r = self.redis()
        p = TcpProxy(r.address).start()
        self.addCleanup(p.close)
        p.blackhole()
        b = self.broker(config(p.url(0)), "blackholed")
        self.assert_refused_at_once_and_nothing_else_hurt(b)

    def test_wrong_password(self):
        r = self.redis(password="right")
        path = os.path.join(self.tmp, "redis.pass")
        with open(path, "w") as f:
            f.write("wrong\n")
        b = self.broker(config(r.url(0), password_file=path), "wrong-password")
        self.assert_refused_at_once_and_nothing_else_hurt(b)

    def test_wrong_database(self):
        r = self.redis(port=0)
        b = self.broker(config(r.url(99, tcp=True)), "wrong-db")
        self.assert_refused_at_once_and_nothing_else_hurt(b)

    def test_not_redis(self):
        n = NotRedis()
        self.addCleanup(n.close)
        b = self.broker(config(f"redis://127.0.0.1:{n.port}/0"), "not-redis")
        self.assert_refused_at_once_and_nothing_else_hurt(b)

    def test_redis_older_than_7(self):
        n = NotRedis(OLD_REDIS)
        self.addCleanup(n.close)
        b = self.broker(config(f"redis://127.0.0.1:{n.port}/0"), "redis-6")
        wait_for(lambda: b.pool("shared")["backend"].get("unavailable") == "redis-version", timeout=10,
                 message="Status to say the Redis is too old")
        self.assert_refused_at_once_and_nothing_else_hurt(b)

    def test_eviction_policy(self):
        r = self.redis(policy="allkeys-lru")
        b = self.broker(config(r.url(0)), "allkeys-lru")
        wait_for(lambda: b.pool("shared")["backend"].get("unavailable") == "eviction-policy", timeout=10,
                 message="Status to name the eviction policy")
        self.assert_refused_at_once_and_nothing_else_hurt(b)

    def test_rules_mismatch(self):
        r = self.redis()
        first = self.broker(config(r.url(0), limit=2, ttl=6), "first")
        wait_for(lambda: first.pool("shared")["backend"]["up"], timeout=60, message="the first node up")
        second = self.broker(config(r.url(0), limit=3, ttl=6), "second")
        wait_for(lambda: second.pool("shared")["backend"].get("unavailable") == "rules", timeout=30,
                 message="the second node to refuse the pool's rules")
        self.assertIn("limit", second.pool("shared")["backend"].get("differingKeys", []))
        self.assert_refused_at_once_and_nothing_else_hurt(second, reason="rules")
        # The first keeps serving the pool under the stored rules, and its local pools.
        self.assertTrue(self.granted_once(first, "local"))
        # A pool's first use waits out one node TTL (recovery: no node can tell new from lost), 6 s here.
        wait_for(lambda: self.granted_once(first, "shared"), timeout=60, interval=0.5,
                 message="a grant on the first node")

    def granted_once(self, b, lane):
        a = b.acquire(lane)
        a.close()
        return a.granted


if __name__ == "__main__":
    (_,), argv = harness.arguments(__doc__, 1)
    harness.main(argv)
