#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Shared pools behind Redis Sentinel (issue 12, SPEC §11 "High availability").

Real processes, started here on private loopback ports and stopped by pid: a primary and a replica
(redis-server), three Sentinels (`redis-server CONF --sentinel`, down-after 1 s, quorum 2) and three
brokerds whose pool grid (limit 4) has backend = redis-sentinel://S1,S2,S3/grid-redis. Client loops run
`slotctl run` of the witness command (witness.py) on all three brokerds.

- kill -9 of the primary under load: the Sentinels promote the replica and every brokerd follows it. Grants
  resume (the time from the kill is printed) within down-after + 5 s (a failover is a Redis restart for
  SPEC §11: a recovery window without new grants while the nodes reclaim, which ends as soon as every
  brokerd has its leases back on the new primary, not after its full node TTL);
  from the commands' side: holders <= limit, no slot twice, tokens unique and increasing along each slot;
  every command that ran through the failover kept its slot (none revoked: exit 124); Status names the new
  primary and counts one failover.
- The Sentinel every brokerd asks first is killed, the other two still a majority: grants go on as before,
  and a failover after it is still followed (through the next Sentinel of the list).
- The primary cut off (a TCP proxy between it and the Sentinels and brokerds drops everything), alive:
  the Sentinels promote the replica and the brokerds follow as after a kill; when the partition heals the
  old primary is made a replica, no brokerd goes back to it, and no slot was held twice (the invariant
  and the commands holding slots through it, as above). TestSentinelPartition: a meson test of its own.
- Sentinels with requirepass: backend-sentinel-password-file= authenticates; a wrong one is refused, said
  in the journal, and the pool is unavailable (backend).
- --check-config prints the sentinel URL and backend-sentinel-password-file=.

A SKIP (77) without redis-server or shared pools.

Usage: test-sentinel.py BROKERD SLOTCTL [unittest arguments, e.g. TestSentinelPartition]
"""
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
from harness import Broker, wait_for  # noqa: E402
from sentineld import MASTER, Topology  # noqa: E402
from witness import Witness  # noqa: E402

SLOTCTL = None
NODES = 3
CLIENTS = 60
LIMIT = 4
DOWN_AFTER = 1.0
# The self-fence margin (TTL − revoke-grace − 2 s = 7 s) outlasts a failover (down-after + election, ~3 s)
# with room for a loaded machine: commands keep their slots through it.
TTL = 10.0
REVOKE_GRACE = 1.0
MAX_HOLD = 1.5
EXIT_CODES = {0, 75}  # ran, or refused at once while the pool had no primary (waiters get unavailable)


def config(backend, node, extra=""):
    return f"""\
[broker]
node-name = node{node}
revoke-grace = {REVOKE_GRACE:g}s

[pool grid]
limit = {LIMIT}
backend = {backend}
backend-node-ttl = {TTL:g}s
{extra}
[lane grid]
pools = grid
policy = wait
"""


class ClientLoop(threading.Thread):
    """`slotctl run`s of the witness, one after the other, on one node; every exit kept with its times."""

    def __init__(self, witness, broker, index, rng, stop):
        super().__init__(name=f"c{index}", daemon=True)
        self.witness, self.broker, self.rng, self.stop = witness, broker, rng, stop
        self.exits = []  # (monotonic s of the start, of the exit, exit status, command name, stderr)

    def run(self):
        n = 0
        while not self.stop.is_set():
            n += 1
            name = f"{self.name}-{n}"
            started = time.monotonic()
            hold = self.rng.uniform(0.2, MAX_HOLD)
            p = subprocess.Popen([SLOTCTL, "run", "--socket", self.broker.socket_path, "--lane", "grid",
                                  "--job", name, "--quiet", "--", *self.witness.command(f"sleep {hold:.2f}", name)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            _, err = p.communicate()
            self.exits.append((started, time.monotonic(), p.returncode, name, err.strip()))
            if p.returncode == 75:
                self.stop.wait(0.3)  # refused at once: no primary yet; do not spin


class SentinelLoad(unittest.TestCase):
    """The topology, three brokerds and the client loops; the tests are its subclasses'."""
    proxied = False

    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-sentinel-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.topo = Topology(self.tmp, sentinels=3, down_after=DOWN_AFTER, proxied=self.proxied).start()
        self.addCleanup(self.topo.close)
        self.sentinels = self.topo.sentinels
        self.url = self.topo.url()
        # The ports before the failover: the primary that is killed, the replica that is promoted.
        self.old_port = self.topo.proxy.port if self.proxied else self.topo.primary.port
        self.new_port = self.topo.replica.port
        self.brokers = []
        for i in range(NODES):
            b = Broker(config(self.url, i), name=f"node{i}").start()
            self.addCleanup(b.stop)
            self.brokers.append(b)
        self.witness = Witness(self.tmp)
        self.stop = threading.Event()
        self.loops = []

    def backend(self, broker):
        return broker.pool("grid").get("backend") or {}

    def start_clients(self):
        rng = random.Random(12)
        self.loops = [ClientLoop(self.witness, self.brokers[i % NODES], i, random.Random(rng.getrandbits(64)),
                                 self.stop) for i in range(CLIENTS)]
        for t in self.loops:
            t.start()
        wait_for(lambda: len(self.witness.started()) >= 2 * LIMIT, timeout=60, message="the first grants")

    def stop_clients(self):
        self.stop.set()
        for t in self.loops:
            t.join(60)
        self.assertEqual([t.name for t in self.loops if t.is_alive()], [], "client loops that never ended")
        return sorted(e for t in self.loops for e in t.exits)

    def running(self):
        """The witnessed commands holding a slot now."""
        ended = {e.name for e in self.witness.ended()}
        return {e.name for e in self.witness.started()} - ended

    def fail_over(self):
        """kill -9 of the primary; returns the monotonic time of the kill once the Sentinels promoted the
        replica. self.held: the commands that held a slot at the kill."""
        self.held = self.running()
        killed = self.topo.fail_over()
        print(f"the Sentinels promoted the replica {time.monotonic() - killed:.2f} s after the kill",
              file=sys.stderr)
        return killed

    def resumed_after(self, killed, window=0.0):
        """Seconds from the kill to the first command started after it (waited for): within down-after + 5 s
        (SPEC §11) when every brokerd reaches the new primary (the recovery window ends as soon as each has
        reclaimed its leases there); window: what a recovery window that runs its full length adds."""
        before = len(self.witness.started())
        bound = DOWN_AFTER + window + 5.0 + harness.LATENESS
        wait_for(lambda: len(self.witness.started()) > before, timeout=bound + 30,
                 message="grants to resume after the failover")
        took = time.monotonic() - killed
        print(f"grants resumed {took:.2f} s after the primary's loss (down-after {DOWN_AFTER:g} s, "
              f"bound {bound:g} s)", file=sys.stderr)
        self.assertLessEqual(took, bound, "grants resumed too late")
        return took

    def check_through(self, exits, killed):
        self.witness.check_shared(self, {"grid": LIMIT})
        odd = [e for e in exits if e[2] not in EXIT_CODES]
        self.assertEqual(odd, [], "slotctl run ended otherwise than 0 or 75 (124: revoked)")
        # Every command holding a slot at the kill kept it to its end: it ended by itself (exit 0).
        self.assertNotEqual(self.held, set(), "no command held a slot at the kill")
        kept = {e[3] for e in exits if e[3] in self.held and e[2] == 0}
        self.assertEqual(self.held - kept, set(), "commands that lost their slot in the failover")
        print(f"commands: {len(exits)}, holding a slot through the failover: {len(self.held)}, "
              f"exits: { {c: sum(1 for e in exits if e[2] == c) for c in sorted(EXIT_CODES)} }", file=sys.stderr)


class TestSentinel(SentinelLoad):
    def test_kill9_of_the_primary_is_followed(self):
        for b in self.brokers:
            wait_for(lambda b=b: self.backend(b).get("up"), timeout=30, message=f"{b.name} to serve the pool")
            self.assertEqual(self.backend(b).get("primary"), f"127.0.0.1:{self.old_port}")
            self.assertEqual(self.backend(b).get("failovers"), 0)
        self.start_clients()
        time.sleep(1)  # load before the kill (not a synchronisation: the loops run regardless)
        killed = self.fail_over()
        self.resumed_after(killed)
        for b in self.brokers:
            wait_for(lambda b=b: self.backend(b).get("primary") == f"127.0.0.1:{self.new_port}", timeout=10,
                     message=f"{b.name} to name the new primary")
            self.assertEqual(self.backend(b).get("failovers"), 1)
            self.assertGreater(self.backend(b).get("lastFailoverAt", 0), 0)
            metrics = b.call("io.slotbroker.Metrics")["text"]
            self.assertIn('slotbroker_backend_failovers_total{pool="grid"} 1', metrics.splitlines())
        out = subprocess.run([SLOTCTL, "status", "--socket", self.brokers[0].socket_path], capture_output=True,
                             text=True, timeout=30).stdout
        self.assertIn(f"sentinel: primary 127.0.0.1:{self.new_port}, 1 failover seen, the last at", out)
        exits = self.stop_clients()
        self.check_through(exits, killed)
        for b in self.brokers:
            # A failover is a Redis restart for the pool: a recovery window, seen by every node.
            self.assertIn("[BACKEND_RECOVERY] Pool grid", b.log())
            self.assertIn(f"[BACKEND_FAILOVER] The Sentinels of {self.url} moved its primary from "
                          f"127.0.0.1:{self.old_port} to 127.0.0.1:{self.new_port}", b.log())

    def test_a_sentinel_down_changes_nothing(self):
        for b in self.brokers:
            wait_for(lambda b=b: self.backend(b).get("up"), timeout=30, message=f"{b.name} to serve the pool")
        self.start_clients()
        self.sentinels[0].kill9()
        down = time.monotonic()
        # The majority is up: nothing changes for the pool; a lease goes on being granted.
        before = len(self.witness.started())
        wait_for(lambda: len(self.witness.started()) >= before + 2 * LIMIT, timeout=30,
                 message="grants with a Sentinel down")
        for b in self.brokers:
            self.assertTrue(self.backend(b).get("up"), f"{b.name}: {self.backend(b)}")
        # And a failover afterwards is still followed, told by the Sentinels left (the grants after it are
        # the other test's).
        killed = self.fail_over()
        for b in self.brokers:
            wait_for(lambda b=b: self.backend(b).get("primary") == f"127.0.0.1:{self.new_port}", timeout=10,
                     message=f"{b.name} to name the new primary")
        exits = self.stop_clients()
        self.assertEqual([e for e in exits if down <= e[1] < killed and e[2] != 0], [],
                         "commands refused while only a Sentinel was down")
        self.check_through(exits, killed)


class TestSentinelPartition(SentinelLoad):
    """Run on its own (a meson test of its own: test-sentinel-partition), to keep each under 2 min."""
    proxied = True

    def test_a_partitioned_primary_is_left_and_comes_back_as_a_replica(self):
        for b in self.brokers:
            wait_for(lambda b=b: self.backend(b).get("up"), timeout=30, message=f"{b.name} to serve the pool")
            self.assertEqual(self.backend(b).get("primary"), f"127.0.0.1:{self.old_port}")
        self.start_clients()
        time.sleep(1)  # load before the partition (not a synchronisation)
        # The primary keeps running, cut off from the Sentinels and every brokerd (bytes lost, as a switch
        # that died): the Sentinels promote its replica, the brokerds follow them.
        self.held = self.running()
        cut = time.monotonic()
        self.topo.proxy.blackhole(direction="both", drop=True)
        wait_for(lambda: self.sentinels[-1].primary_port() == self.new_port, timeout=30,
                 message="the Sentinels to promote the replica")
        print(f"the Sentinels promoted the replica {time.monotonic() - cut:.2f} s after the partition",
              file=sys.stderr)
        self.resumed_after(cut)
        # The partition heals: the Sentinels make the old primary a replica of the new one; no brokerd goes
        # back to it, and no slot is held twice.
        healed = len(self.witness.started())
        self.topo.proxy.passthrough()
        wait_for(lambda: self.topo.primary.info("replication").get("role") == "slave", timeout=30,
                 message="the old primary to be made a replica")
        wait_for(lambda: len(self.witness.started()) >= healed + 2 * LIMIT, timeout=60,
                 message="grants after the partition healed")
        for b in self.brokers:
            self.assertEqual(self.backend(b).get("primary"), f"127.0.0.1:{self.new_port}")
            self.assertTrue(self.backend(b).get("up"), f"{b.name}: {self.backend(b)}")
        exits = self.stop_clients()
        self.check_through(exits, cut)


class TestSentinelPassword(unittest.TestCase):
    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-sentinel-pw-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.topo = Topology(self.tmp, sentinels=1, password="sekrit").start()
        self.addCleanup(self.topo.close)

    def broker(self, password, name):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(password + "\n")
        b = Broker(config(self.topo.url(), 0, f"backend-sentinel-password-file = {path}\n"), name=name).start()
        self.addCleanup(b.stop)
        return b

    def test_sentinel_password_file_authenticates(self):
        good, bad = self.broker("sekrit", "good"), self.broker("wrong", "bad")
        wait_for(lambda: (good.pool("grid").get("backend") or {}).get("up"), timeout=30, message="the pool served")
        self.assertEqual(good.pool("grid")["backend"]["primary"], f"127.0.0.1:{self.topo.primary.port}")
        # A refused password: no primary named, the pool refused (backend), the journal says why.
        wait_for(lambda: "AUTH refused" in bad.log(), timeout=30, message="the refusal in the journal")
        backend = bad.pool("grid")["backend"]
        self.assertFalse(backend["up"])
        self.assertNotIn("primary", backend)
        self.assertEqual(backend.get("unavailable"), "backend")


class TestSentinelConfig(unittest.TestCase):
    def test_check_config_prints_the_sentinel_keys(self):
        tmp = tempfile.mkdtemp(prefix="test-sentinel-config-")
        self.addCleanup(shutil.rmtree, tmp, True)
        password = os.path.join(tmp, "sentinel-password")
        with open(password, "w") as f:
            f.write("secret\n")
        url = f"redis-sentinel://10.0.0.21,10.0.0.22:26380,[::1]/{MASTER}?db=2"
        b = Broker(config(url, 0, f"backend-sentinel-password-file = {password}\n"), name="check")
        self.addCleanup(b.cleanup)
        out = subprocess.run([b.brokerd, "--check-config", "--config", b.config_path], capture_output=True,
                             text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn(f"backend={url}", out.stdout.splitlines())
        self.assertIn(f"backend-sentinel-password-file={password}", out.stdout.splitlines())

        b.write_config(config(f"redis-sentinel://10.0.0.21,10.0.0.21/{MASTER}", 0))
        out = subprocess.run([b.brokerd, "--check-config", "--config", b.config_path], capture_output=True,
                             text=True, timeout=30)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("redis-sentinel://HOST[:PORT],…/MASTER[?db=DB]", out.stderr)


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
