#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A shared pool's waiters live through Redis losing its data (SPEC §11, "Redis restarted, failed over, or
lost data"; brokerd.conf(5), "When Redis restarts, fails over or loses its data").

One brokerd, a pool of one slot in a redis-server of the test's own: a client holds the slot, another waits
for it. Then Redis loses the pool:
- redis-server restarted without its data (no persistence), within the waiter grace;
- FLUSHALL (the same server: same run id, the pool made anew);
- a failover that brokerd's two connections meet at different moments: the backend's address (a Unix socket
  path, a symlink here) leads to another server, the command link reconnects there, the stream reader
  stays blocked on the old one, which then appends a grant of the waiter (as an old primary's tick would).
Redis has no record of the waiter any more ("gone" to brokerd's places query). The waiter is not refused
(it was, "node-expired", before): brokerd submits it again under its request id and arrival, it keeps
waiting through the recovery window, and is granted once the holder released and the window passed (one
backend-node-ttl: a pool made anew knows nobody). The holder keeps its lease (reclaimed), never revoked.

Skipped (77) without redis-server or shared pools. It waits out recovery windows: never in parallel.

Usage: test-shared-lost-waiters.py BROKERD SLOTCTL [unittest arguments]
"""
import os
import shutil
import sys
import tempfile
import time

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
from harness import wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402

# backend-node-ttl: the recovery window of a pool made anew. The holder's self-fence comes TTL − 3 s after
# its last heartbeat: a restart of redis-server fits well within it, and within the waiter grace (5 s).
TTL = 8
SLOTCTL = None


class LostWaiters(harness.BrokerTestCase):

    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-lost-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.redis = RedisServer(self.tmp).start()
        self.addCleanup(self.redis.close)

    def backend_up(self, b):
        wait_for(lambda: b.pool("shared")["backend"]["up"], timeout=30, message=f"{b.name}: the backend up")

    def holder_and_waiter(self, name):
        b = self.broker(harness.shared_pool_config(self.redis.url(), "node-a", TTL), name)
        self.backend_up(b)
        holder = self.acquire(b, "ci")
        holder.until_granted(timeout=TTL + 20)  # the pool's first use waits out one TTL
        waiter = self.acquire(b, "ci")
        self.assertTrue(waiter.queued, waiter.msg)
        wait_for(lambda: b.status()["waiters"] or None, timeout=10, message="the waiter listed")
        return b, holder, waiter

    def arrived(self, acquisition):
        """The messages that have arrived on an Acquire call's connection, without waiting for more."""
        out = []
        while (msg := acquisition.conn.poll(0.0)) is not None:
            acquisition.msg = msg
            acquisition.replies.append(msg)
            acquisition.times.append(time.monotonic())
            out.append(msg)
        return out

    def assert_waits_then_granted(self, b, holder, waiter, lost_at):
        """The waiter, still waiting after Redis lost its record, is granted when the holder releases after
        the recovery window; never refused. The holder was never told anything (no revocation)."""
        self.backend_up(b)
        # Redis forgot the waiter: brokerd's places query (a page a heartbeat) finds it "gone". A few
        # heartbeats on, and until the holder leaves, it still waits (the message it would have got is a
        # refusal: none came).
        def still_waiting():
            for m in self.arrived(waiter):
                self.assertEqual((m.get("error"), m.get("parameters", {}).get("state")), (None, "queued"),
                                 f"the waiter was told this while the slot was held: {m}")
            return b.status()["waiters"] and time.monotonic() > lost_at + 3 or None
        wait_for(still_waiting, timeout=20, message="three heartbeats after the loss, the waiter still listed")
        self.assertEqual(len(b.status()["waiters"]), 1, b.status())
        for m in self.arrived(holder):
            self.assertIsNone(m.get("error"), m)
            self.assertNotIn(m.get("parameters", {}).get("state"), ("revoked", "lost"), m)
        holder.close()
        waiter.until_granted(timeout=TTL + 20)
        granted_at = waiter.times[-1]
        # Nothing granted inside the window of the pool made anew (one TTL from its first heartbeat on the
        # emptied Redis, which came after lost_at).
        self.assertGreaterEqual(granted_at - lost_at, TTL - 1,
                                f"granted {granted_at - lost_at:.1f} s after the loss, inside the recovery window")
        self.assertGreater(waiter.lease["token"], holder.lease["token"])

    def test_a_waiter_outlives_a_restart_of_redis_without_its_data(self):
        b, holder, waiter = self.holder_and_waiter("lost-restart")
        lost_at = time.monotonic()
        self.redis.restart(keep_data=False)
        self.assert_waits_then_granted(b, holder, waiter, lost_at)

    def test_a_waiter_outlives_a_flushall(self):
        b, holder, waiter = self.holder_and_waiter("lost-flushall")
        lost_at = time.monotonic()
        self.redis.call("FLUSHALL")
        self.assert_waits_then_granted(b, holder, waiter, lost_at)

    def test_a_grant_read_from_the_old_server_is_not_taken(self):
        """The old server's grant is of data brokerd reclaimed from: taken, the waiter would hold a slot the new
        server counts for its holder (two holders, one slot). brokerd drops what the reader read there,
        reconnects it to the command link's server, and the waiter is granted there when the holder leaves."""
        link = os.path.join(self.tmp, "redis.sock")
        os.symlink(self.redis.socket_path, link)
        b = self.broker(harness.shared_pool_config(f"unix://{link}?db=0", "node-a", TTL), "lost-split")
        self.backend_up(b)
        holder = self.acquire(b, "ci")
        holder.until_granted(timeout=TTL + 20)
        with open(os.path.join(b.state_dir, "node-id")) as f:
            node = f.read().strip()  # the node's id in the pool's keys (node-name is what the journal says)
        nr, stream = "{sb:shared}:nr:" + node, "{sb:shared}:s:" + node
        held = set(self.redis.call("ZRANGE", nr, 0, -1))
        waiter = self.acquire(b, "ci")
        self.assertTrue(waiter.queued, waiter.msg)
        rids = sorted(set(self.redis.call("ZRANGE", nr, 0, -1)) - held)
        self.assertEqual(len(rids), 1, (held, rids))
        # The holder's grant as the old server wrote it: the forged one differs in its rid and token only.
        entries = self.redis.call("XRANGE", stream, "-", "+")
        self.assertTrue(entries, "the holder's grant in the stream")
        fields = dict(zip(entries[-1][1][0::2], entries[-1][1][1::2]))
        self.assertEqual(fields.get("verdict"), "granted", fields)

        new = RedisServer(self.tmp).start()
        self.addCleanup(new.close)
        os.symlink(new.socket_path, link + ".new")
        os.replace(link + ".new", link)
        # The command link's connection ends (as a failover's CLIENT KILL would); the reader's, blocked in
        # XREAD, stays on the old server.
        with self.redis.client() as c:
            me = c.call("CLIENT", "ID")
            for line in c.call("CLIENT", "LIST").splitlines():
                f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
                if int(f["id"]) != me and f.get("cmd") != "xread":
                    c.call("CLIENT", "KILL", "ID", f["id"])
        # On the new server: the holder reclaimed, the waiter submitted again under its rid (Redis lost it).
        wait_for(lambda: rids[0] in new.call("ZRANGE", nr, 0, -1) or None, timeout=20,
                 message="the waiter submitted again on the new server")
        self.assertTrue(any("cmd=xread" in line for line in self.redis.call("CLIENT", "LIST").splitlines()),
                        "the reader still blocked on the old server")

        fields.update(rid=rids[0], token=str(1 << 40))
        self.redis.call("XADD", stream, "*", *[x for kv in fields.items() for x in kv])

        def followed():
            for m in self.arrived(waiter):
                self.assertEqual((m.get("error"), m.get("parameters", {}).get("state")), (None, "queued"),
                                 f"the waiter was told this by the old server's entry: {m}")
            return "stream read follows the commands" in b.log() or None
        wait_for(followed, timeout=10, message="the reader reconnected to the command link's server")
        wait_for(lambda: not any("cmd=xread" in line for line in self.redis.call("CLIENT", "LIST").splitlines())
                 or None, timeout=10, message="the reader gone from the old server")
        self.assertEqual(len(b.status()["waiters"]), 1, b.status())
        self.assertEqual(b.pool("shared")["inUse"], 1)
        holder.close()
        waiter.until_granted(timeout=TTL + 20)
        self.assertNotEqual(waiter.lease["token"], 1 << 40)
        self.assertTrue(b.alive(), "brokerd died")


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
