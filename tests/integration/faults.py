#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""faults.py — the seeded faults of the shared-pool tests (issue 11), and how to tell whether brokerd has
shared pools at all.

A schedule is a list of Faults drawn from MENU by a random.Random(seed): every entry of the menu once (in
a shuffled order), then random ones of FILL (the menu without its 60 s blackhole) up to `count`, so that a
run covers every kind and the same seed gives the same run ($SLOTBROKER_FAULT_SEED; the test prints the
seed it used). A Cluster applies one fault at a time to a redis-server (redisd.RedisServer), the TCP proxy
in front of each brokerd (tcpproxy.TcpProxy) and the brokerds (harness.Broker), waits its duration, and
undoes it.

    for f in schedule(seed(), count=20, nodes=3):
        record = cluster.inject(f)           # returns once the fault is over (brokerd restarted, proxy passing)

Python 3 standard library only; imported beside harness.py.
"""
import collections
import os
import random
import signal
import time

import harness
import redisd

SEED_VARIABLE = "SLOTBROKER_FAULT_SEED"

# node: the brokerd (or its proxy) the fault hits; None for Redis's. seconds: how long it lasts (kill9: how
# long the brokerd stays dead before it is started again on the same state directory).
Fault = collections.namedtuple("Fault", "kind node seconds")

# (kind, seconds): the memo's list (issue11-plan.md §5.4). seconds None: drawn from KILL9_DOWN.
MENU = (
        ("kill9", None),                # kill -9 of a brokerd, started again after 0–25 s
        ("sigstop", 20.0),              # SIGSTOP of a brokerd, longer than the test's node TTL (15 s)
        ("redis-restart-aof", 0.0),     # SIGTERM of Redis and a start on its AOF: a new run id, the data kept
        ("redis-restart-lost", 0.0),    # SIGKILL of Redis and a start on an empty directory: the data lost
        ("client-pause", 3.0),          # CLIENT PAUSE 3000
        ("blackhole", 5.0),             # a brokerd's proxy forwards nothing: shorter than the TTL − margin…
        ("blackhole", 60.0),            # … and much longer than the TTL
        ("reset", 0.0),                 # a brokerd's proxy resets its connections
        ("delay", 5.0),                 # a brokerd's proxy holds every chunk 5 s, for 5 s
)
# What the schedule draws from once every entry of MENU had its turn: the same without the long blackhole,
# which alone lasts a quarter of a run (issue 11 asks for it; once per run is enough to cover it).
FILL = tuple(e for e in MENU if e != ("blackhole", 60.0))
KINDS = tuple(sorted({k for k, _ in MENU}))
NODE_KINDS = ("kill9", "sigstop", "blackhole", "reset", "delay")
KILL9_DOWN = (0.0, 25.0)


def seed():
    """$SLOTBROKER_FAULT_SEED, or a fresh one (to be printed by the test, so that a failure can be rerun)."""
    value = os.environ.get(SEED_VARIABLE)
    return int(value) if value else random.SystemRandom().randrange(1 << 32)


def schedule(seed, count=20, nodes=3, menu=MENU, fill=FILL):
    """`count` (≥ len(menu)) Faults: each menu entry once, then random entries of `fill`; nodes drawn in
    range(nodes)."""
    if count < len(menu):
        raise ValueError(f"a schedule of {count} faults cannot cover the {len(menu)} of the menu")
    rng = random.Random(seed)
    entries = list(menu)
    rng.shuffle(entries)
    entries += [rng.choice(fill) for _ in range(count - len(menu))]
    out = []
    for kind, seconds in entries:
        if seconds is None:
            seconds = round(rng.uniform(*KILL9_DOWN), 3)
        out.append(Fault(kind, rng.randrange(nodes) if kind in NODE_KINDS else None, seconds))
    return out


# What a Cluster records of each fault it injected: monotonic times of its start and end.
Injected = collections.namedtuple("Injected", "fault start end")


class Cluster:
    """The processes a fault can hit: `redis`, and per node i `proxies[i]` (brokerd i's way to Redis) and
    `brokers[i]`."""

    def __init__(self, redis, proxies, brokers):
        self.redis, self.proxies, self.brokers = redis, proxies, brokers
        self.injected = []

    def inject(self, fault, on_applied=None):
        """Applies the fault, waits its duration, undoes it; returns (and keeps) an Injected. on_applied(start)
        is called as soon as the fault has hit (a kill -9 done, a proxy blackholing), before the wait."""
        start = time.monotonic()
        self._on_applied = on_applied or (lambda start: None)
        getattr(self, "_" + fault.kind.replace("-", "_"))(fault.node, fault.seconds)
        record = Injected(fault, start, time.monotonic())
        self.injected.append(record)
        return record

    def _kill9(self, node, seconds):
        b = self.brokers[node]
        b.crash()
        self._applied()
        time.sleep(seconds)  # the fault's length, not a synchronisation
        b.start()

    def _sigstop(self, node, seconds):
        pid = self.brokers[node].pid
        os.kill(pid, signal.SIGSTOP)
        self._applied()
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)

    def _redis_restart_aof(self, node, seconds):
        self.redis.restart(keep_data=True)
        self._applied()

    def _redis_restart_lost(self, node, seconds):
        self.redis.restart(keep_data=False, kill=True)
        self._applied()

    def _client_pause(self, node, seconds):
        self.redis.pause(int(seconds * 1000))
        self._applied()
        time.sleep(seconds)

    def _blackhole(self, node, seconds):
        self._proxy_rule(self.proxies[node].blackhole, seconds)

    def _delay(self, node, seconds):
        self._proxy_rule(lambda s: self.proxies[node].delay(s, duration=s), seconds)

    def _proxy_rule(self, apply, seconds):
        apply(seconds)
        self._applied()
        time.sleep(seconds)
        # The rule ends by itself at its time; the fault is over once the proxy says so.
        harness.wait_for(lambda: all(p.passing() for p in self.proxies), message="the proxies passing again")

    def _reset(self, node, seconds):
        self.proxies[node].reset()
        self._applied()

    def _applied(self):
        self._on_applied(time.monotonic())


# ---- do we have shared pools? ----

NOT_BUILT = "shared pools are not built yet"


def shared_pools_built(brokerd=None):
    """(True, None) if `brokerd` (default: the one under test, $BROKERD) runs a pool with a backend; else
    (False, reason).
    It must accept `backend = redis://127.0.0.1:1/0` in --check-config and, started with it, keep running
    (the pool unavailable, Redis being unreachable) instead of exiting "Operation not supported", as
    brokerd did before issue 11. Any other exit is a failure of brokerd, raised as AssertionError."""
    config = ("[pool shared]\nlimit = 1\nbackend = redis://127.0.0.1:1/0\n\n"
              "[lane ci]\npools = shared\n")
    b = harness.Broker(config, name="probe-shared", brokerd=brokerd)
    try:
        check = b.check_config()
        if check.returncode != 0:
            return False, f"{NOT_BUILT} (--check-config refuses backend=: {check.stderr.strip()})"
        b.start(wait=False)
        answered = harness.wait_for(lambda: _answers_or_exited(b), timeout=20,
                                    message="brokerd with a shared pool to answer or exit")
        if answered == "answers":
            return True, None
        if "Operation not supported" in b.log():
            return False, NOT_BUILT
        raise AssertionError(f"brokerd with a shared pool exited with {b.proc.returncode}:\n{b.log()[-3000:]}")
    finally:
        b.cleanup()


_built = None


def skip_unless_shared_pools(test):
    """In a TestCase's setUp: skipTest() (the reason of shared_pools_built(), probed once per run) unless
    the brokerd under test has shared pools, or redis-server is missing. In setUp rather than setUpClass:
    a skipped class runs no test, and harness.main() exits 77 only when every test that ran skipped."""
    global _built
    redisd.require_redis_server()
    if _built is None:
        _built = shared_pools_built()
    if not _built[0]:
        test.skipTest(_built[1])


def _answers_or_exited(b):
    if b.proc.poll() is not None:
        return "exited"
    try:
        with harness.Varlink(b.socket_path, timeout=1.0) as c:
            c.call("org.varlink.service.GetInfo")
        return "answers"
    except (OSError, harness.ConnectionClosed, TimeoutError):
        return None
