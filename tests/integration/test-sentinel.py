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
  brokerd has its leases back on the new primary and it is 1 s old, not after its full node TTL);
  from the commands' side: holders <= limit, no slot twice, tokens unique and increasing along each slot;
  every command that ran through the failover kept its slot (none revoked: exit 124); Status names the new
  primary and counts one failover.
- The Sentinel every brokerd asks first is killed, the other two still a majority: grants go on as before,
  and a failover after it is still followed (through the next Sentinel of the list).
- The old primary cut off together with one brokerd X, alive (the issue's partition): the primary is behind
  a TCP proxy that the Sentinels and the replica use, X lists the Sentinels through proxies of its own;
  X's Sentinel proxies drop everything and the primary's drops every connection but X's (tcpproxy's
  spare()). The Sentinels promote the replica and the two other brokerds follow and grant again; X, whose
  heartbeats the old primary still answers, fences itself (no majority of the Sentinels confirms its
  primary: its acquires get 75, its commands holding slots end 124, its journal says why), and from the
  commands' side no slot was held twice, across all three nodes (X's grants on the old primary included).
  When the partition heals the old primary is made a replica, nobody goes back to it, and X follows the
  Sentinels to the new primary and grants again. TestSentinelPartition: a meson test of its own.
- One brokerd's connections to the Sentinels: two to the one it asks (its confirmation round's link, which
  carries its question too, and its +switch-master subscription), one to each other (the round's); with that
  Sentinel killed, the same to the next one it asks.
- An idle brokerd asks the Sentinels nothing (its confirmation rounds rest while it holds nothing); a
  fail-fast request after its confirmation went stale is granted (held for the round it wakes, not refused
  "unconfirmed"), nothing is journaled as lost, and the rounds rest again once its lease ends. With one
  Sentinel of three hung (SIGSTOP, its connection up), such a request is granted on the two others' word,
  before the hung one's question runs out.
- Sentinels with requirepass: backend-sentinel-password-file= authenticates; a wrong one is refused, said
  in the journal, and the pool is unavailable (backend).
- --check-config prints the sentinel URL and backend-sentinel-password-file=.

A SKIP (77) without redis-server or shared pools.

Usage: test-sentinel.py BROKERD SLOTCTL [unittest arguments, e.g. TestSentinelPartition]
"""
import os
import random
import shutil
import signal
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
from tcpproxy import TcpProxy  # noqa: E402
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
REVOKED = 124  # slotctl run's exit when the slot was revoked (a fence)


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
            b = Broker(config(self.url_for(i), i), name=f"node{i}").start()
            self.addCleanup(self.stop_broker, b)
            self.brokers.append(b)
        self.witness = Witness(self.tmp)
        self.stop = threading.Event()
        self.loops = []

    def stop_broker(self, b):
        # Under the sanitizers an error or a leak found at exit is a non-zero status.
        status = b.stop()
        self.assertEqual(status, 0, f"{b.name} exited with status {status}:\n{b.log()[-4000:]}")

    def url_for(self, node):
        """The backend= of brokerd `node`."""
        return self.url

    def backend(self, broker):
        return broker.pool("grid").get("backend") or {}

    @staticmethod
    def node_of(name):
        """The brokerd a client loop's command ran on ("c7-3": loop 7)."""
        return int(name[1:].split("-")[0]) % NODES

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
        reclaimed its leases there, 1 s after it opened at the earliest); window: what a recovery window that
        runs its full length adds."""
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
    X = 0  # the brokerd cut off with the old primary

    def url_for(self, node):
        if node != self.X:
            return self.url
        self.x_proxies = [TcpProxy(("127.0.0.1", s.port), name=f"x-sentinel-{k}").start()
                          for k, s in enumerate(self.sentinels)]
        for p in self.x_proxies:
            self.addCleanup(p.close)
        return "redis-sentinel://" + ",".join(f"127.0.0.1:{p.port}" for p in self.x_proxies) + f"/{MASTER}"

    def long_command(self, broker, name):
        """A witnessed command on broker that holds its slot until witness.stop(name); slotctl's stderr in
        p.err_path."""
        err_path = os.path.join(self.tmp, f"{name}.stderr")
        with open(err_path, "w") as err:
            p = subprocess.Popen([SLOTCTL, "run", "--socket", broker.socket_path, "--lane", "grid", "--job", name,
                                  "--quiet", "--", *self.witness.command_until_stopped(name)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        p.err_path = err_path
        self.addCleanup(lambda: p.poll() is None and (self.witness.stop(name), p.wait(30)))
        return p

    def started_on(self, nodes, since=0):
        """Commands of the client loops of `nodes` started, counted from the `since`-th start."""
        return [e for e in self.witness.started()[since:] if e.name.startswith("c") and self.node_of(e.name) in nodes]

    def test_a_brokerd_cut_off_with_the_old_primary_fences_itself(self):
        x = self.brokers[self.X]
        others = [i for i in range(NODES) if i != self.X]
        for b in self.brokers:
            wait_for(lambda b=b: self.backend(b).get("up"), timeout=30, message=f"{b.name} to serve the pool")
            self.assertEqual(self.backend(b).get("primary"), f"127.0.0.1:{self.old_port}")
        wait_for(lambda: "confirmedAgoMs" in self.backend(x), timeout=10, message="a first confirmation")
        # Two commands on X that hold their slots until stopped: the partition must revoke them before the
        # new primary can give their slots to the others (which the witness would see).
        longs = {f"x-long-{k}": self.long_command(x, f"x-long-{k}") for k in range(2)}
        wait_for(lambda: all(self.witness.started(n) for n in longs), timeout=30, message="X's long commands")
        self.start_clients()
        # Cut while commands of the other nodes hold slots: they must keep them through the failover.
        self.held = wait_for(lambda: {n for n in self.running() if n.startswith("c") and self.node_of(n) != self.X},
                             timeout=30, message="a command of the other nodes to hold a slot")

        # The partition: X and the old primary see each other, nothing else.
        cut = time.monotonic()
        self.assertGreaterEqual(self.topo.proxy.spare(x.pid), 2, "X's links to the primary")
        for p in self.x_proxies:
            p.blackhole(drop=True)
        self.topo.proxy.blackhole(drop=True)
        wait_for(lambda: self.sentinels[-1].primary_port() == self.new_port, timeout=30,
                 message="the Sentinels to promote the replica")
        promoted = time.monotonic()
        print(f"the Sentinels promoted the replica {promoted - cut:.2f} s after the partition", file=sys.stderr)

        # X: the old primary still answers it, the Sentinels no longer confirm it. It refuses at once, and
        # its commands holding slots are revoked (slotctl run exits 124) by its self-fence.
        wait_for(lambda: self.backend(x).get("unavailable") == "unconfirmed", timeout=10,
                 message="X to stop serving its unconfirmed primary")
        self.assertEqual(self.backend(x).get("primary"), f"127.0.0.1:{self.old_port}")
        refused = subprocess.run([SLOTCTL, "run", "--socket", x.socket_path, "--lane", "grid", "--quiet", "--",
                                  "true"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        self.assertEqual(refused.returncode, 75, refused.stderr)
        for name, p in longs.items():
            p.wait(timeout=TTL + 30)
            with open(p.err_path) as err:
                self.assertEqual(p.returncode, REVOKED, f"{name}: {err.read()}")
        fenced = time.monotonic()
        print(f"X's commands were revoked {fenced - cut:.2f} s after the partition", file=sys.stderr)
        self.assertIn("[BACKEND_UNCONFIRMED] Pool grid", x.log())
        # slotctl's own fence (the last "held" deadline, SPEC §11) and brokerd's fence timer fall due at
        # the same instant: either may act first on a loaded machine. brokerd journals its fence when it still
        # vouched for a lease then; when slotctl's came first, the commands' releases took the leases out
        # before it, and there is nothing left to fence (nor to journal): X holds nothing either way.
        wait_for(lambda: "[BACKEND_FENCED] Pool grid" in x.log() or not x.status()["holders"], timeout=10,
                 message="X to journal its fence, or to hold nothing")
        # A command that slotctl's SIGKILL caught in its TERM trap (a loaded machine: the trap outlived the revoke
        # grace) leaves the trap's children as zombies of the test, a subreaper: they keep the command's group,
        # and so its lease, until reaped (as PID 1 reaps them in production). Only those groups: the client
        # loops' slotctl statuses are their own.
        def x_holders():
            holders = x.status()["holders"]
            for h in holders:
                if h["lease"].get("commandPid"):
                    harness.reap(-h["lease"]["commandPid"])
            return holders

        try:
            wait_for(lambda: not x_holders(), timeout=10, message="X to hold nothing after its fence")
        except AssertionError as e:
            raise AssertionError(f"{e}; X holds {x.status()['holders']!r}; X's log ends:\n"
                                 + "\n".join(x.log().splitlines()[-60:])) from None

        # The others follow the Sentinels and grant again, the slots X held included (its node expires on
        # the new primary a TTL after the failover at the latest).
        for i in others:
            b = self.brokers[i]
            wait_for(lambda b=b: self.backend(b).get("primary") == f"127.0.0.1:{self.new_port}", timeout=10,
                     message=f"{b.name} to name the new primary")
        since = len(self.witness.started())
        wait_for(lambda: len(self.started_on(others, since)) >= 2 * LIMIT, timeout=DOWN_AFTER + TTL + 30,
                 message="the other nodes to grant again")
        print(f"the others granted again {time.monotonic() - cut:.2f} s after the partition", file=sys.stderr)
        self.witness.check_shared(self, {"grid": LIMIT})

        # The partition heals: the old primary is made a replica of the new one, nobody goes back to it, and
        # X follows the Sentinels to the new primary and grants again.
        for p in self.x_proxies:
            p.passthrough()
        self.topo.proxy.spare(None)
        self.topo.proxy.passthrough()
        healed = time.monotonic()
        # Sentinel converts an old primary only once it has seen its role for 8 s, refreshing a replica's
        # INFO every 10 s: usually within 20 s, now and then more (bench-sentinel's rejoins: over 30 s in 3 of
        # ~40), hence the long bound.
        wait_for(lambda: self.topo.primary.replication().get("role") == "slave", timeout=90,
                 message="the old primary to be made a replica")
        print(f"the Sentinels made the old primary a replica {time.monotonic() - healed:.2f} s after the heal",
              file=sys.stderr)
        wait_for(lambda: self.backend(x).get("primary") == f"127.0.0.1:{self.new_port}", timeout=30,
                 message="X to follow the Sentinels to the new primary")
        since = len(self.witness.started())
        wait_for(lambda: len(self.started_on([self.X], since)) >= 2, timeout=DOWN_AFTER + TTL + 30,
                 message="X to grant again")
        for b in self.brokers:
            self.assertEqual(self.backend(b).get("primary"), f"127.0.0.1:{self.new_port}")
            wait_for(lambda b=b: self.backend(b).get("up"), timeout=10, message=f"{b.name} to serve the pool")
        self.assertIn("[BACKEND_CONFIRMED] Pool grid", x.log())
        exits = self.stop_clients()

        # From the commands' side, across the three nodes: no slot twice, never more than the limit.
        self.witness.check_shared(self, {"grid": LIMIT})
        odd = [e for e in exits if e[2] not in EXIT_CODES and not (e[2] == REVOKED and self.node_of(e[3]) == self.X)]
        self.assertEqual(odd, [], "slotctl run ended otherwise than 0 or 75 (or 124 on X)")
        kept = {e[3] for e in exits if e[3] in self.held and e[2] == 0}
        self.assertEqual(self.held - kept, set(), "commands of the other nodes that lost their slot")
        print(f"commands: {len(exits)}, exits: { {c: sum(1 for e in exits if e[2] == c) for c in (0, 75, 124)} }",
              file=sys.stderr)


class SentinelsAndOneBrokerd(unittest.TestCase):
    """Three real Sentinels, and a brokerd a test starts; what the Sentinels see of its connections."""

    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-sentinel-one-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.topo = Topology(self.tmp, sentinels=3, down_after=DOWN_AFTER).start()
        self.addCleanup(self.topo.close)

    @staticmethod
    def brokerd_links(sentinel):
        """CLIENT LIST's fields of the Sentinel's clients that are brokerd's (the Sentinels name their links to
        each other; the test's own connection is the one asking CLIENT LIST)."""
        fields = [dict(f.split("=", 1) for f in line.split() if "=" in f)
                  for line in sentinel.call("CLIENT", "LIST").splitlines()]
        return [f for f in fields if f.get("name") == "" and f.get("cmd") != "client|list"]


class TestSentinelConnections(SentinelsAndOneBrokerd):
    """What a fleet of N brokerds costs each Sentinel in connections (brokerd.conf(5), "Room for the fleet
    behind Sentinels": about 2 N on the one asked, N on the others)."""

    def brokerd_clients(self, sentinel):
        return sorted(f["cmd"] for f in self.brokerd_links(sentinel))

    def test_two_connections_to_the_sentinel_asked_one_to_the_others(self):
        b = Broker(config(self.topo.url(), 0), name="conn").start()
        self.addCleanup(b.stop)
        wait_for(lambda: (b.pool("grid").get("backend") or {}).get("up"), timeout=30, message="the pool served")
        asked = ["sentinel|get-master-addr-by-name", "subscribe"]
        other = ["sentinel|get-master-addr-by-name"]
        s = self.topo.sentinels
        # A round's question on every link is under way within a second of the pool's first service.
        wait_for(lambda: [self.brokerd_clients(x) for x in s] == [asked, other, other], timeout=10,
                 message="two connections to the first Sentinel, one to each other")
        s[0].kill9()
        wait_for(lambda: [self.brokerd_clients(x) for x in s[1:]] == [asked, other], timeout=15,
                 message="the subscription moved to the second Sentinel, nothing more")
        self.assertTrue(b.pool("grid")["backend"]["up"])


class TestSentinelRest(SentinelsAndOneBrokerd):
    """An idle brokerd's confirmation rounds rest (brokerd.conf(5), "Room for the fleet behind Sentinels")."""

    QUESTION = "sentinel|get-master-addr-by-name"

    def idle(self):
        """Per Sentinel, the seconds since brokerd last asked it where the primary is (CLIENT LIST's idle of
        brokerd's round link there; a Sentinel has no commandstats). None: no such link yet."""
        out = []
        for s in self.topo.sentinels:
            idle = [int(f["idle"]) for f in self.brokerd_links(s) if f.get("cmd") == self.QUESTION]
            out.append(min(idle) if idle else None)
        return out

    def resting(self):
        """No Sentinel asked for more than three seconds (CLIENT LIST counts whole seconds of its clock)."""
        return all(i is not None and i >= 4 for i in self.idle())

    def test_an_idle_node_asks_nothing_and_still_grants_at_once(self):
        b = Broker(config(self.topo.url(), 0, "[lane now]\npools = grid\npolicy = fail-fast\n"), name="rest").start()
        self.addCleanup(b.stop)
        backend = lambda: b.pool("grid").get("backend") or {}  # noqa: E731
        wait_for(lambda: backend().get("up"), timeout=30, message="the pool served")
        # The pool's first use is a recovery window (a node TTL): a waiter is granted after it.
        first = b.acquire("grid")
        first.until_granted(timeout=TTL + 20)
        first.close()
        # No round for over three seconds: no Sentinel asked, the confirmation older than a grant may rest on.
        wait_for(self.resting, timeout=20, interval=0.2, message="the rounds to rest")
        self.assertGreater(backend().get("confirmedAgoMs", 0), 3000, backend())
        # Served all the same, by Status, whose view of the other nodes is fetched for it as ever.
        self.assertTrue(backend().get("up"), backend())
        self.assertNotIn("unavailable", backend())
        self.assertLess(backend().get("snapshotAgeMs", 10**9), 1000, backend())

        held = b.acquire("now")
        self.addCleanup(held.close)
        self.assertTrue(held.granted, held.msg)
        # Every Sentinel was asked for it, within the second: the round it woke.
        self.assertTrue(all(i is not None and i <= 1 for i in self.idle()), self.idle())
        self.assertNotIn("BACKEND_UNCONFIRMED", b.log())
        # Held, the lease is fenced from the rounds: they go on.
        time.sleep(2.5)  # a window that a resting node would leave unasked, not a synchronisation
        self.assertTrue(all(i is not None and i <= 1 for i in self.idle()), self.idle())
        held.close()
        wait_for(self.resting, timeout=20, interval=0.2, message="the rounds to rest again")

    def test_a_hung_sentinel_holds_no_wake_round(self):
        b = Broker(config(self.topo.url(), 0, "[lane now]\npools = grid\npolicy = fail-fast\n"), name="hung").start()
        self.addCleanup(b.stop)
        wait_for(lambda: (b.pool("grid").get("backend") or {}).get("up"), timeout=30, message="the pool served")
        first = b.acquire("grid")
        first.until_granted(timeout=TTL + 20)
        first.close()
        wait_for(self.resting, timeout=20, interval=0.2, message="the rounds to rest")
        # The third Sentinel hangs with its connection up: the round the request wakes asks it, and its
        # question runs out only after the 1 s command timeout, which ends its link (logged, at debug).
        hung = self.topo.sentinels[2]

        def ran_out():
            return any(f"Sentinel 127.0.0.1:{hung.port}:" in line and "A command got no reply" in line
                       for line in b.log().splitlines())
        hung.proc.send_signal(signal.SIGSTOP)
        self.addCleanup(lambda: hung.proc.poll() is None and hung.proc.send_signal(signal.SIGCONT))
        held = b.acquire("now")
        self.addCleanup(held.close)
        self.assertTrue(held.granted, held.msg)
        # Granted on the two others' word, before the hung one's question ran out: a majority decides the
        # round (before, the request waited for the round's last answer, a second here).
        self.assertFalse(ran_out(), "granted only once the hung Sentinel's question ran out")
        wait_for(ran_out, timeout=10, message="the hung Sentinel's question to run out")
        hung.proc.send_signal(signal.SIGCONT)
        rested = b.log().count("the rounds rest.")
        held.close()
        wait_for(lambda: b.log().count("the rounds rest.") > rested, timeout=20, interval=0.2,
                 message="the rounds to rest again once the lease ended")


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
        out = b.check_config()
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn(f"backend={url}", out.stdout.splitlines())
        self.assertIn(f"backend-sentinel-password-file={password}", out.stdout.splitlines())

        b.write_config(config(f"redis-sentinel://10.0.0.21,10.0.0.21/{MASTER}", 0))
        out = b.check_config()
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("redis-sentinel://HOST[:PORT],…/MASTER[?db=DB]", out.stderr)


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
