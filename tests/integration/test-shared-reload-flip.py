#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Configuration flipped under load (issue 19, SPEC §11 "Reload and restart change a pool's sharing
safely"): two brokerds, two redis-servers X and Y, client loops running `slotctl run` of the witness on both
brokerds, while the pool `grid` is flipped by reload, over and over and on each brokerd on its own, between
local (limit 1 or 2), shared on X (limit 1 or 2), shared on Y, and removed.

Each place a pool can be kept is a *side* with slots of its own names (members): a's local pool a-l0, a-l1;
b's b-l0, b-l1; X's x0, x1; Y's y0, y1; the spare pool the lanes fall back to when grid is removed, a-s0 and
b-s0. A lease stays on the side it was granted on until it ends (brokerd.conf(5), "Moving a pool to or from
Redis"), so, from the commands' own side:

- no slot is held twice at once (the witness's lock file per member name);
- no side ever has more slots held at once than the largest limit its rules allowed (2, or 1 for spare);
- fencing tokens are unique per side and increase along each slot's holders;
- every `slotctl run` ends with 0 (it ran) or 75 (refused: busy, timeout, unavailable — a pool refused for
  its rules while the two brokerds disagree, a waiter of a pool that moved), nothing else;
- every reload is applied (Status shows the pool where the new configuration puts it) or refused with its
  reason (a backend change while the node holds leases), and both brokerds exit 0 when stopped.

Skipped (77) without redis-server or shared pools. About a minute.

Usage: test-shared-reload-flip.py BROKERD SLOTCTL [unittest arguments]
"""
import collections
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
import witness  # noqa: E402
from harness import VarlinkError, wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402

SLOTCTL = None
TTL = 6          # seconds: backend-node-ttl (the recovery window of each Redis's first use)
FLIP_FOR = 45    # seconds of flipping
LOOPS = 2        # client loops per brokerd
SIDE_LIMITS = {"a-l": 2, "b-l": 2, "x": 2, "y": 2, "a-s": 1, "b-s": 1}
VARIANTS = [("local", 1), ("local", 2), ("x", 1), ("x", 2), ("y", 1), ("y", 2), ("removed", 0)]


def config(node, place, limit, urls):
    if place == "removed":
        grid, pools = "", "spare"
    else:
        names = [f"{node}-l{i}" for i in range(limit)] if place == "local" else [f"{place}{i}" for i in range(limit)]
        grid = f"[pool grid]\nmembers = {' '.join(names)}\n"
        if place != "local":
            grid += f"backend = {urls[place]}\nbackend-node-ttl = {TTL}s\n"
        pools = "grid"
    return f"""\
[broker]
node-name = {node}
revoke-grace = 1s

[pool spare]
members = {node}-s0

{grid}
[lane ci]
pools = {pools}
policy = wait
"""


class SideWitness(witness.Witness):
    """The witness, with the holders counted per side (the member name without its number) instead of per
    pool name: each side has its own limit."""

    def __init__(self, directory):
        super().__init__(directory)
        old = 'set -- "$held"/*\nprintf \'%s %s %s\\n\' "$SLOT_POOL" "$#" "$n" >>"$d/holders"'
        new = ('side=${slots%%[0-9]*}\nset -- "$held"/"$side"[0-9]*\n'
               'printf \'%s %s %s\\n\' "$side" "$#" "$n" >>"$d/holders"')
        assert old in witness.SCRIPT
        with open(self.script, "w") as f:
            f.write(witness.SCRIPT.replace(old, new))


class ClientLoop(threading.Thread):
    def __init__(self, w, broker, index, rng, stop):
        super().__init__(name=f"{broker.name}-c{index}", daemon=True)
        self.w, self.broker, self.rng, self.stop = w, broker, rng, stop
        self.exits = []  # (exit status, command name, stderr)

    def run(self):
        n = 0
        while not self.stop.is_set():
            n += 1
            name = f"{self.name}-{n}"
            p = subprocess.Popen([SLOTCTL, "run", "--socket", self.broker.socket_path, "--lane", "ci", "--quiet",
                                  "--max-wait", "2s", "--job", name, "--",
                                  *self.w.command(f"sleep {self.rng.uniform(0.05, 0.8):.2f}", name)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True)
            _, err = p.communicate()
            self.exits.append((p.returncode, name, err.strip()))
            if p.returncode == 75:
                self.stop.wait(0.1)


class TestFlipUnderLoad(harness.BrokerTestCase):
    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-flip-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.redis = {k: RedisServer(self.tmp, name=f"redis-{k}").start() for k in ("x", "y")}
        for r in self.redis.values():
            self.addCleanup(r.close)
        self.urls = {k: r.url() for k, r in self.redis.items()}

    def test_flip_under_load(self):
        seed = int(os.environ.get("SLOTBROKER_FAULT_SEED") or time.time())
        print(f"seed {seed} (SLOTBROKER_FAULT_SEED)", file=sys.stderr)
        rng = random.Random(seed)
        brokers = [self.broker(config(n, "x", 2, self.urls), n) for n in ("a", "b")]
        w = SideWitness(self.tmp)
        stop = threading.Event()
        loops = [ClientLoop(w, b, i, random.Random(rng.random()), stop) for b in brokers for i in range(LOOPS)]
        for t in loops:
            t.start()

        reloads = collections.Counter()
        refusals = []
        end = time.monotonic() + FLIP_FOR
        try:
            while time.monotonic() < end:
                b = rng.choice(brokers)
                place, limit = rng.choice(VARIANTS)
                b.write_config(config(b.name, place, limit, self.urls))
                try:
                    b.reload()
                    reloads["applied", place] += 1
                    # Applied means applied: the pool is where the configuration says (never ignored).
                    pools = {p["name"]: p for p in b.status()["pools"]}
                    if place == "removed":
                        self.assertNotIn("grid", pools)
                    else:
                        self.assertEqual("backend" in pools["grid"], place != "local", (place, pools["grid"]))
                except VarlinkError as e:
                    text = " ".join(e.parameters.get("errors", []))
                    # The one refusal the flips may meet: a shared pool's backend changed while busy here.
                    self.assertIn("cannot move to another backend", text, e.parameters)
                    reloads["refused", place] += 1
                    refusals.append(text)
                time.sleep(rng.uniform(0.3, 1.5))  # the pace of the flips, not a synchronisation
        finally:
            stop.set()
            for t in loops:
                t.join(30)
        print(f"reloads: {dict(reloads)}", file=sys.stderr)

        exits = collections.Counter(code for t in loops for code, _, _ in t.exits)
        print(f"slotctl run exits: {dict(exits)}", file=sys.stderr)
        odd = [(code, name, err) for t in loops for code, name, err in t.exits if code not in (0, 75)]
        self.assertEqual(odd, [], "slotctl run ended otherwise than 0 or 75")
        self.assertGreater(exits[0], 0, "no command ran at all")
        self.assertTrue(any(k[0] == "applied" and k[1] in ("x", "y") for k in reloads), reloads)
        self.assertTrue(any(k[0] == "applied" and k[1] == "local" for k in reloads), reloads)

        # Every command that started also ended (none left holding a slot).
        started = {e.name for e in w.started()}
        ended = {e.name for e in w.ended()}
        self.assertEqual(started - ended, set(), "commands that never ended")

        w.check_violations(self)
        w.check_limits(self, SIDE_LIMITS)
        per_side = collections.defaultdict(dict)
        per_slot = collections.defaultdict(list)
        for e in w.started():
            side = e.slots[0].rstrip("0123456789")
            other = per_side[side].setdefault(e.token, e.name)
            self.assertEqual(other, e.name, f"{e.name} and {other} both got token {e.token} on side {side}")
            per_slot[e.slots[0]].append((e.token, e.name))
        for slot, seen in per_slot.items():
            tokens = [t for t, _ in seen]
            self.assertEqual(tokens, sorted(set(tokens)), f"tokens of slot {slot} do not increase: {seen}")
        for b in brokers:
            self.assertTrue(b.alive(), f"{b.name} died")


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
