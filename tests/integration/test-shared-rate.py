#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""One local user cannot fill the fleet's Redis (issue 19 i).

Every Acquire on a shared pool, even one refused at once, leaves a record in Redis (its outcome key). An
unprivileged user (nobody) hammers Acquire (wait=false) on a busy shared pool from several connections for a
few seconds. brokerd lets through at most max-acquire-burst-per-uid + max-acquire-rate-per-uid × the time,
refusing the rest before Redis hears of them (unavailable, reason "rate", retryAfterSec): the keys Redis
holds (DBSIZE) grow by no more than that, whatever the hammer's speed, and the cost is printed (keys,
used_memory, bytes/s). Meanwhile another uid (root) is still served: its waiter gets the slot when its
holder lets go, and its own immediate Acquire is answered by the pool (busy), not by the rate limit.

Usage: test-shared-rate.py BROKERD [unittest arguments]
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
from harness import NOBODY_UID, NOGROUP_GID, wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402

RATE, BURST = 20, 50
HAMMER_SECONDS = 4.0
CONNECTIONS = 4

# The hammer, run as nobody: CONNECTIONS connections, each one Acquire after the other (a reply each) until
# the time is up; prints {reply kind: count} as JSON. Kinds: "granted", an error name, with ":reason".
HAMMER = r"""
import json, socket, sys, threading, time
path, lane, seconds, n = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
counts, lock, retry = {}, threading.Lock(), []
call = json.dumps({"method": "io.slotbroker.Acquire", "parameters": {"lane": lane, "wait": False}}).encode() + b"\0"
def run():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    end, buf = time.monotonic() + seconds, b""
    while time.monotonic() < end:
        s.sendall(call)
        while b"\0" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                return
            buf += chunk
        msg, buf = buf.split(b"\0", 1)
        m = json.loads(msg)
        p = m.get("parameters", {})
        kind = m.get("error") or p.get("state", "?")
        if p.get("reason"):
            kind += ":" + p["reason"]
            if p["reason"] == "rate":
                retry.append(p.get("retryAfterSec"))
        with lock:
            counts[kind] = counts.get(kind, 0) + 1
        if m.get("error") is None and p.get("state") == "granted":
            s.close()  # let the slot go: a fresh connection
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
threads = [threading.Thread(target=run) for _ in range(n)]
for t in threads: t.start()
for t in threads: t.join()
counts["retryAfterSec"] = sorted(set(r for r in retry if r is not None))
print(json.dumps(counts))
"""


def config(backend):
    return f"""\
[broker]
node-name = rate-a
max-acquire-rate-per-uid = {RATE}/s
max-acquire-burst-per-uid = {BURST}

[pool one]
limit = 1
backend = {backend}
backend-node-ttl = 10s

[lane one]
pools = one
policy = wait
"""


class TestSharedRate(harness.BrokerTestCase):
    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("runs a client as nobody: needs root")
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-rate-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.redis = RedisServer(self.tmp).start()
        self.addCleanup(self.redis.close)

    def redis_info(self):
        """(keys in db 0, used_memory)."""
        return int(self.redis.call("DBSIZE")), int(self.redis.info("memory")["used_memory"])

    def test_one_uid_cannot_fill_redis(self):
        a = self.broker(config(self.redis.url()), "rate-a")
        wait_for(lambda: a.pool("one")["backend"]["up"], timeout=30, message="the backend up")
        # Root holds the only slot (through the recovery window of the pool's first use), and waits for it.
        holder = self.acquire(a, "one", job="holder")
        holder.until_granted(timeout=40)
        waiter = self.acquire(a, "one", job="waiter")
        waiter.until(lambda m: m.queued, timeout=10, what="root's waiter queued")
        keys_before, memory_before = self.redis_info()

        hammer = subprocess.Popen([harness.CLIENT_PYTHON, "-c", HAMMER, a.socket_path, "one", str(HAMMER_SECONDS),
                                   str(CONNECTIONS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  user=NOBODY_UID, group=NOGROUP_GID, extra_groups=[], cwd="/")
        self.addCleanup(lambda: hammer.poll() is None and (hammer.kill(), hammer.wait()))
        started = time.monotonic()
        # Meanwhile root is served: an immediate Acquire is answered by the pool (busy), not refused for rate.
        with self.assertRaises(harness.VarlinkError) as refused:
            a.call("io.slotbroker.Acquire", {"lane": "one", "wait": False})
        self.assertEqual(refused.exception.error, "io.slotbroker.Busy", refused.exception.parameters)
        out, err = hammer.communicate(timeout=HAMMER_SECONDS + 30)
        elapsed = time.monotonic() - started
        self.assertEqual(hammer.returncode, 0, err)
        counts = json.loads(out)
        keys_after, memory_after = self.redis_info()

        total = sum(v for k, v in counts.items() if k != "retryAfterSec")
        passed = total - counts.get("io.slotbroker.Unavailable:rate", 0)
        allowed = BURST + RATE * elapsed
        print(f"\nhammer: {counts} in {elapsed:.1f} s; Redis keys {keys_before} -> {keys_after}, used_memory "
              f"{memory_before} -> {memory_after} ({(memory_after - memory_before) / elapsed:.0f} bytes/s; "
              f"{(memory_after - memory_before) / max(keys_after - keys_before, 1):.0f} bytes a key)", file=sys.stderr)
        self.assertGreater(total, allowed, "the hammer was too slow to test anything")
        self.assertLessEqual(passed, allowed + 1, f"more Acquires than the rate let through: {counts}")
        self.assertGreater(counts.get("io.slotbroker.Unavailable:rate", 0), 0, counts)
        self.assertTrue(counts["retryAfterSec"] and min(counts["retryAfterSec"]) >= 1, counts)
        # What reached Redis is bounded: at most a record per Acquire let through (and a few of the node's).
        self.assertLessEqual(keys_after - keys_before, allowed + 10,
                             f"Redis keys grew from {keys_before} to {keys_after} under one uid's hammer")
        # And its memory: a refusal's record is about 100 bytes; 1 KiB each leaves room for the allocator.
        self.assertLessEqual(memory_after - memory_before, (allowed + 10) * 1024,
                             f"Redis used_memory grew from {memory_before} to {memory_after} under one uid's hammer")

        # An immediate refusal's record lasts 10 s (the retry of a lost reply), not the node TTL + 10 s (20 s):
        # its expiry in the node's index ({sb:P}:ox:NODE, pool clock µs; brokerd/lua/README, "Outcome records").
        now = int(self.redis.call("HGET", "{sb:one}:clock", "last_now"))
        outcomes = []
        for k in self.redis.call("KEYS", "{sb:one}:ox:*"):
            r = self.redis.call("ZRANGE", k, 0, -1, "WITHSCORES")
            outcomes += [int(float(r[i + 1])) for i in range(0, len(r), 2)]
        long_lived = [e for e in outcomes if e - now > 10_000_000]
        self.assertGreater(len(outcomes), BURST)
        self.assertLessEqual(len(long_lived), 2, f"{len(long_lived)} of {len(outcomes)} outcome records outlive 10 s")

        # The other uid's waiter gets the slot when its holder lets go.
        holder.close()
        waiter.until_granted(timeout=10)
        # The refusals were audited (journaled, rate-limited) and the uid's bucket refills: a later Acquire
        # of nobody's is answered by the pool again (busy: root's waiter holds the slot now).
        def nobody_served():
            out = harness.run_client_as(a.socket_path, "io.slotbroker.Acquire", {"lane": "one", "wait": False})
            return out[0].get("error") == "io.slotbroker.Busy" or None
        wait_for(nobody_served, timeout=10, message="nobody's Acquire answered by the pool again")


if __name__ == "__main__":
    _, argv = harness.arguments(__doc__, 1)
    harness.main(argv)
