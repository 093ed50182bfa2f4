#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Faults under load on pools shared by three brokerds through one Redis (issue 11, SPEC §11).

Three brokerds, each reaching Redis through a TCP proxy of its own (tcpproxy.py), share a pool of 4
anonymous slots and a member pool of 3 (backend-node-ttl = 15s, revoke-grace = 1s). 60 client loops, spread
over them, run `slotctl run` of the witness command (witness.py) holding 50 ms–3 s, but one loop per node
holding 15–30 s (longer than the TTL: what fencing and the "no revocation" check need). A seeded schedule
(faults.py, $SLOTBROKER_FAULT_SEED, printed) of at least 20 faults, one at a time: kill -9 of a brokerd
(started again after 0–25 s), SIGSTOP of a brokerd for 20 s (> TTL), Redis restarted on its AOF and with
its data lost, CLIENT PAUSE 3000, a proxy blackholing for 5 s and for 60 s, resetting, delaying 5 s.

Checked, from the commands' side:
- witness.check_shared(): never two commands on a slot, at most the limit held at every instant, fencing
  tokens unique per pool and increasing along each slot's holders;
- no brokerd dies but by the schedule's kill -9, and each exits 0 on SIGTERM at the end;
- every `slotctl run` ends once, with 0, 69 (no broker: its brokerd was down), 75 (refused: unavailable)
  or 124 (revoked: fenced), and as it says: a command that ran (0, 124) started once and ended once, a
  refused one (75) never started;
- after each fault grants resume (the time to the next start is printed), within TTL + 5 s of its end;
- no command revoked (exit 124) but by a fault on its own node that may revoke: kill -9, SIGSTOP, or an
  outage longer than TTL − (revoke-grace + 2 s) − 1 s (11 s); never by a 5 s blackhole or delay, a reset,
  CLIENT PAUSE, a Redis restart;
- the slots a kill -9'd node's commands held are started by other commands within TTL + 2 s of the kill
  when it stayed away that long (else within its restart + reclaim-grace, or 2 s after the end of a
  command that reclaimed its lease), or 2 s after the recovery window of a Redis restart just before
  (SPEC §11: no grant during it); the next fault waits for that.
Not checked: one final history row per request on its node (issue11-plan.md §5.4): a kill -9 loses the
rows brokerd had not written yet, by design (SPEC §7: history is written off the hot path).

slotctl run fences its command (Acquire fence: true, SPEC §11 and the memo's §4.4): brokerd renews the
deadline after each acknowledged heartbeat, and a brokerd that is stopped or killed renews nothing, so
its commands stop before Redis frees their slots. A run takes 4–5 minutes: the faults' own durations (the
60 s blackhole once), a recovery window (one TTL) after each Redis restart, the takeovers after a kill -9.
SLOTBROKER_TEST_KEEP=1 keeps the witness's files (their "times" file has realtime stamps, as the fault
lines printed have) and the brokerds' logs, to read a failure again.

Skipped (77) with "shared pools are not built yet" until brokerd runs a pool with backend= (faults.py's
shared_pools_built(): before issue 11 it exits "Operation not supported"), and without redis-server.

Usage: test-shared-faults.py BROKERD SLOTCTL [unittest arguments]
Environment: SLOTBROKER_FAULT_SEED (default: random, printed), SLOTBROKER_FAULT_COUNT (default 20).
"""
import collections
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
from redisd import RedisServer  # noqa: E402
from tcpproxy import TcpProxy  # noqa: E402
from witness import Witness  # noqa: E402

SLOTCTL = None
NODES = 3
CLIENTS = 60
LIMIT = 4
MEMBERS = ("m1", "m2", "m3")
TTL = 15.0
REVOKE_GRACE = 1.0
RECLAIM_GRACE = 3.0
MAX_HOLD = 3.0
# The hold of a long loop's commands: one long loop per node.
LONG_HOLD = (TTL, 2 * TTL)
# SPEC §11: nothing is revoked by an outage shorter than this (the last ack may be one heartbeat old).
SAFE_OUTAGE = TTL - (REVOKE_GRACE + 2.0) - 1.0
EXIT_CODES = {0, 69, 75, 124}


def config(backend, node):
    return f"""\
[broker]
node-name = node{node}
revoke-grace = {REVOKE_GRACE:g}s
reclaim-grace = {RECLAIM_GRACE:g}s

[pool grid]
limit = {LIMIT}
backend = {backend}
backend-node-ttl = {TTL:g}s

[pool rig]
members = {" ".join(MEMBERS)}
backend = {backend}
backend-node-ttl = {TTL:g}s

[lane grid]
pools = grid
policy = wait

[lane rig]
pools = rig
policy = wait
"""


class ClientLoop(threading.Thread):
    """`slotctl run`s of the witness, one after the other, on one node; every exit kept with its time. A long
    loop's commands hold longer than the TTL: only they can outlive a stopped or killed brokerd's slots, and
    only they see whether an outage shorter than the TTL − margin revokes anything."""

    def __init__(self, witness, brokers, node, index, rng, stop, long=False):
        super().__init__(name=f"n{node}-c{index}", daemon=True)
        self.witness, self.brokers, self.node, self.rng, self.stop = witness, brokers, node, rng, stop
        self.holds = LONG_HOLD if long else (0.05, MAX_HOLD)
        self.exits = []  # (monotonic s of the exit, exit status, command name, stderr, monotonic s of the start)

    def body(self, hold):
        if hold <= MAX_HOLD:
            return f"sleep {hold:.2f}"
        # In steps, so that the end of the test (witness.stop("all")) does not wait for it.
        return f'i={int(hold * 10)}; while [ $i -gt 0 ] && [ ! -e "$d/stop-all" ]; do sleep 0.1; i=$((i-1)); done'

    def run(self):
        n = 0
        while not self.stop.is_set():
            n += 1
            name = f"{self.name}-{n}"
            lane = self.rng.choice(("grid", "grid", "rig"))
            started = time.monotonic()
            hold = self.rng.uniform(*self.holds)
            p = subprocess.Popen([SLOTCTL, "run", "--socket", self.brokers[self.node].socket_path, "--lane", lane,
                                  "--job", name, "--quiet", "--reclaim-for", f"{TTL:g}s",
                                  "--kill-after", f"{REVOKE_GRACE:g}s", "--",
                                  *self.witness.command(self.body(hold), name)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            _, err = p.communicate()
            self.exits.append((time.monotonic(), p.returncode, name, err.strip(), started))
            if p.returncode in (69, 75):
                self.stop.wait(0.5)  # its brokerd is down, or refuses at once (Redis unreachable): do not spin


class TestSharedFencing(harness.BrokerTestCase):
    """The fault test's SIGSTOP on its own, in seconds: a brokerd stopped under a `slotctl run` of a shared
    pool renews nothing, so the command stops (124) before Redis frees its slot for another node."""
    TTL = 6.0  # the shortest backend-node-ttl a revoke-grace of 1 s allows: a fence 3 s after the last ack

    def config(self, backend, node):
        return f"""\
[broker]
node-name = {node}
revoke-grace = 1s

[pool one]
limit = 1
backend = {backend}
backend-node-ttl = {self.TTL:g}s

[lane one]
pools = one
policy = wait
"""

    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-fencing-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.redis = RedisServer(self.tmp).start()
        self.addCleanup(self.redis.close)
        self.witness = Witness(self.tmp)

    def run_witness(self, broker, name, body):
        p = subprocess.Popen([SLOTCTL, "run", "--socket", broker.socket_path, "--lane", "one", "--quiet",
                              "--kill-after", "1s", "--", *self.witness.command(body, name)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.addCleanup(p.stderr.close)
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
        return p

    def test_stopped_brokerd_fences_its_command_before_its_slot_is_freed(self):
        a = self.broker(self.config(self.redis.url(), "node-a"), "fencing-a")
        b = self.broker(self.config(self.redis.url(), "node-b"), "fencing-b")
        for node in (a, b):  # until then a node refuses the pool at once
            wait_for(lambda: node.pool("one")["backend"]["up"], timeout=30, message=f"{node.name}: the backend up")
        on_a = self.run_witness(a, "on-a", "sleep 3600")
        # A pool's first use waits one TTL (its recovery window): a generous bound, never a sleep.
        wait_for(lambda: self.witness.started("on-a"), timeout=self.TTL + 30, message="the command on A to start")
        on_b = self.run_witness(b, "on-b", "sleep 0.1")
        wait_for(lambda: b.pool("one")["waiting"] or None, timeout=10, message="B's command to wait")

        os.kill(a.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            rc = on_a.wait(self.TTL + harness.LATENESS)
            fenced_after = time.monotonic() - stopped
            # Redis frees A's slot a TTL after its last heartbeat: B's command takes it then.
            self.assertEqual(on_b.wait(self.TTL + 20), 0, on_b.stderr.read())
        finally:
            os.kill(a.pid, signal.SIGCONT)
        stderr = on_a.stderr.read()
        self.assertEqual(rc, 124, stderr)
        self.assertIn("no renewal of the lease came in time", stderr)
        self.assertLess(fenced_after, self.TTL, "the command outlived its node's TTL")
        # Never both at once (B's command would have found A's lock file), and the fencing tokens go on.
        self.witness.check_shared(self, {"one": 1})
        self.assertEqual([e.name for e in self.witness.started()], ["on-a", "on-b"])


class TestSharedFaults(unittest.TestCase):
    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-faults-")
        if not os.environ.get("SLOTBROKER_TEST_KEEP"):  # the witness's files, to read a failure again
            self.addCleanup(shutil.rmtree, self.tmp, True)
        self.redis = RedisServer(self.tmp, appendonly=True).start()
        self.addCleanup(self.redis.close)
        self.proxies = []
        for _ in range(NODES):
            p = TcpProxy(self.redis.address).start()
            self.addCleanup(p.close)
            self.proxies.append(p)
        self.brokers = []
        for i, p in enumerate(self.proxies):
            b = Broker(config(p.url(0), i), name=f"node{i}").start()
            self.addCleanup(b.stop)
            self.brokers.append(b)
        self.witness = Witness(self.tmp)

    @staticmethod
    def takeover_bound(fault):
        """How long after a kill -9 the slots its node's commands held may stay taken: Redis frees a node
        that stayed away TTL + 2 s after its kill (SPEC §11). A node started again before that reclaims its
        leases: one whose command still runs ends with it (MAX_HOLD), one whose slotctl is gone waits for
        reclaim-grace from the restart."""
        if fault.seconds >= TTL:
            return TTL + 2.0
        return max(TTL + 2.0, fault.seconds + max(RECLAIM_GRACE, MAX_HOLD) + 2.0)

    def watch_takeover(self, fault, killed_at, out, recovery_until=None):
        """From the kill -9 of the fault's node at monotonic `killed_at`: how long until each slot its
        commands held was started by another command, into out[(pool, slot)] (None: not within
        takeover_bound()), polled on a thread of its own (the fault's own wait runs meanwhile). Another
        command, not another node's: a node started again reclaims its leases, and its clients queue with
        everyone else's. recovery_until: the latest end of a recovery window (a Redis restart shortly
        before), which grants nothing before it (SPEC §11); grants resume 2 s after it (SPEC §12)."""
        node = fault.node
        events = self.witness.events()
        mine = lambda e: e.name.startswith(f"n{node}-")  # noqa: E731
        held = {}
        for e in events:
            for s in e.slots:
                if e.what == "start" and mine(e):
                    held[e.pool, s] = e.name
                elif e.what == "end" and held.get((e.pool, s)) == e.name:
                    del held[e.pool, s]
        for key in held:
            out[key] = None
        seen = len(events)

        due = max(killed_at + self.takeover_bound(fault), (recovery_until or 0.0) + 2.0) + harness.LATENESS
        deadline = {key: due for key in held}
        if fault.seconds < TTL:
            # Its node came back in time: a command that reclaimed its lease holds on until its own end
            # (a long one, 2 TTL at most), and its slot is due 2 s after that end.
            longest = killed_at + LONG_HOLD[1] + REVOKE_GRACE + 2.0 + harness.LATENESS
            deadline = {key: max(due, longest) for key in held}

        # A free slot is not always started again at once (in a pool of members, the waiters may take the
        # other free ones): a live node's Status also tells, once it was seen to list the slot as the killed
        # node's (so that its snapshot is a fresh one), when it no longer does.
        seen_held = set()
        others = [b for i, b in enumerate(self.brokers) if i != node]

        def held_by_killed():
            for b in others:
                try:
                    status = b.status(timeout=2)
                except Exception:  # noqa: BLE001 (a node may be busy: ask the next)
                    continue
                held_now = set()
                for h in status.get("otherHolders") or []:
                    if h["node"] == f"node{node}":
                        for name in (h.get("members") or []) + [str(x) for x in h["slots"]]:
                            held_now.add((h["pool"], name))
                return held_now
            return None

        def poll():
            while any(v is None and time.monotonic() < deadline[k] for k, v in out.items()):
                held_now = held_by_killed()
                for key in held:
                    if held_now is None or out[key] is not None:
                        continue
                    if key in held_now:
                        seen_held.add(key)
                    elif key in seen_held:
                        out[key] = time.monotonic() - killed_at  # Redis freed it
                for e in self.witness.events()[seen:]:
                    for s in e.slots:
                        key = e.pool, s
                        if key not in held:
                            continue
                        if e.what == "start" and out[key] is None and e.name != held[key]:
                            out[key] = time.monotonic() - killed_at
                        elif e.what == "end" and e.name == held[key] and key not in ended:
                            ended.add(key)
                            deadline[key] = max(due, time.monotonic() + 2.0 + harness.LATENESS)
                time.sleep(harness.POLL_INTERVAL)
        ended = set()
        t = threading.Thread(target=poll, daemon=True)
        t.start()
        return t

    def check_outcomes(self, exits):
        """Every `slotctl run` has the one outcome its exit status says: a command that ran (0, 124) logged
        one start and one end, a refused one (75) never started."""
        starts, ends = collections.Counter(), collections.Counter()
        for e in self.witness.events():
            (starts if e.what == "start" else ends)[e.name] += 1
        twice = {n: c for n, c in starts.items() if c > 1}
        self.assertEqual(twice, {}, "commands started more than once")
        wrong = [(name, code, starts[name], ends[name]) for _, code, name, _, _ in exits
                 if (code in (0, 124) and (starts[name], ends[name]) != (1, 1)) or (code == 75 and starts[name])]
        self.assertEqual(wrong, [], "slotctl run's exit status and what its command did disagree "
                         "(name, status, starts, ends)")

    def test_seeded_faults_keep_the_invariant(self):
        began = time.monotonic()
        seed = faults.seed()
        count = int(os.environ.get("SLOTBROKER_FAULT_COUNT", "20"))
        plan = faults.schedule(seed, count=count, nodes=NODES)
        print(f"{faults.SEED_VARIABLE}={seed}: {len(plan)} faults: {plan}", file=sys.stderr)
        rng = random.Random(seed)
        stop = threading.Event()
        loops = [ClientLoop(self.witness, self.brokers, i % NODES, i, random.Random(rng.getrandbits(64)), stop,
                            long=i < NODES)
                 for i in range(CLIENTS)]
        for t in loops:
            t.start()
        cluster = faults.Cluster(self.redis, self.proxies, self.brokers)
        resumed = []
        watchers = []  # (kill9 fault, {(pool, slot): seconds to a takeover}, thread)
        # A Redis restart starts a recovery window of one TTL from the nodes' first heartbeat on the new
        # server (a reconnect and a heartbeat: 2 s at most).
        recovery_until = None
        try:
            wait_for(lambda: len(self.witness.started()) >= LIMIT, timeout=60, message="the first grants")
            for f in plan:
                before = len(self.witness.started())
                takeover = {}
                on_applied = None
                if f.kind == "kill9":
                    on_applied = lambda at, f=f, out=takeover, r=recovery_until: watchers.append(  # noqa: E731
                        (f, out, self.watch_takeover(f, at, out, r)))
                record = cluster.inject(f, on_applied)
                if f.kind.startswith("redis-restart"):
                    recovery_until = record.end + TTL + 2.0
                took = wait_for(lambda: len(self.witness.started()) > before and time.monotonic(),
                                timeout=TTL + 5 + harness.LATENESS, message=f"grants to resume after {f}")
                resumed.append((f, took - record.end))
                # Grants resume on any node first; the next fault waits until every node reaches Redis again,
                # so that two faults never add up to one longer outage of a node (which may rightly fence it).
                wait_for(lambda: all(self.reaches_redis(b) for b in self.brokers), timeout=TTL + 5 + harness.LATENESS,
                         message=f"every node to reach Redis again after {f}")
                if f.kind == "kill9" and watchers:
                    # The next fault waits for the takeover: a SIGSTOP of the node its slots went to, or a
                    # Redis restart, would hold them legitimately, and the takeover be unseen.
                    watchers[-1][2].join(LONG_HOLD[1] + TTL + 10)
                print(f"{f}: from {time.time() - (time.monotonic() - record.start):.3f} (realtime) for "
                      f"{record.end - record.start:.2f} s; grants resumed {took - record.end:.2f} s after its end",
                      file=sys.stderr)
        finally:
            stop.set()
            self.witness.stop("all")
            for t in loops:
                t.join(120)
        self.assertEqual([t.name for t in loops if t.is_alive()], [], "client loops that never ended")

        # Every check runs, and every failure is told: one run is minutes.
        failures = []

        def check(fn, *args):
            try:
                fn(*args)
            except AssertionError as e:
                failures.append(str(e))

        check(self.witness.check_shared, self, {"grid": LIMIT, "rig": len(MEMBERS)})
        for f, out, t in watchers:
            t.join(LONG_HOLD[1] + self.takeover_bound(f) + 10)
            late = {k: v for k, v in out.items() if v is None}
            check(self.assertEqual, late, {}, f"slots of the node killed by {f} not taken over within "
                  f"{self.takeover_bound(f):g} s (or 2 s after a recovery window): {out}")
            print(f"{f}: its {len(out)} held slots taken over after "
                  f"{', '.join(f'{v:.2f}' for v in out.values() if v is not None) or '-'} s", file=sys.stderr)
        exits = sorted(e for t in loops for e in t.exits)
        odd = [e for e in exits if e[1] not in EXIT_CODES]
        check(self.assertEqual, odd, [], "slotctl run ended otherwise than 0, 69, 75 or 124")
        check(self.check_outcomes, exits)
        check(self.check_revocations, exits, cluster.injected)
        # No brokerd died on its own meanwhile (a crash is no fault of the schedule's), and each exits cleanly.
        check(self.assertEqual, [b.name for b in self.brokers if not b.alive()], [], "brokerds that died")
        check(self.assertEqual, {b.name: b.stop() for b in self.brokers}, {b.name: 0 for b in self.brokers},
              "brokerds' exit statuses on SIGTERM")
        print(f"faults: {len(cluster.injected)}, commands: {len(exits)}, "
              f"exits: { {c: sum(1 for e in exits if e[1] == c) for c in sorted(EXIT_CODES)} }, "
              f"slowest resumption: {max(t for _, t in resumed):.2f} s, "
              f"run: {time.monotonic() - began:.0f} s ({faults.SEED_VARIABLE}={seed})", file=sys.stderr)
        if failures:
            self.fail("\n".join(failures))

    @staticmethod
    def reaches_redis(b):
        """Whether brokerd b has both shared pools' backend link up (a recovery window counts: it is reached)."""
        try:
            return all(b.pool(p)["backend"].get("unavailable") != "backend" for p in ("grid", "rig"))
        except Exception:  # a brokerd restarting after its kill -9 answers nothing yet
            return False

    def check_revocations(self, exits, injected):
        """Every revoked command (exit 124) lived through a fault that may revoke on its node: a kill -9 or a
        SIGSTOP of its brokerd, or a blackhole or delay of its proxy longer than TTL − margin. Nothing else
        revokes: not a 5 s blackhole or delay, a reset, CLIENT PAUSE, a Redis restart, another node's fault."""
        def may_revoke(f, node):
            if f.node is not None and f.node != node:
                return False
            return f.kind in ("kill9", "sigstop") or f.seconds > SAFE_OUTAGE

        unexplained = []
        for end, code, name, err, start in exits:
            if code != 124:
                continue
            node = int(name.split("-")[0][1:])
            # The fence comes within the fault; the command's end up to --kill-after later.
            if not any(may_revoke(r.fault, node) and r.start <= end and start <= r.end + REVOKE_GRACE + 1.0
                       for r in injected):
                during = [r.fault for r in injected if r.start <= end and start <= r.end]
                unexplained.append((name, f"lived {start - injected[0].start:.1f}..{end - injected[0].start:.1f} s "
                                    f"into the faults", during, err[-300:]))
        self.assertEqual(unexplained, [], f"commands revoked by no fault that may revoke (one shorter than "
                         f"{SAFE_OUTAGE:g} s, or another node's)")


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
