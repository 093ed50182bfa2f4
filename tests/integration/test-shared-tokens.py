#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Tokens never go back (SPEC §11), also when Redis lost its data on a host whose clock is behind.

Two brokerds share a pool of one slot through a redis-server whose wall clock the test steps
(clockshift.so, an LD_PRELOAD: its CLOCK_REALTIME, gettimeofday() and time() shifted by the seconds in a
file; its monotonic clock untouched, as an NTP step leaves it). Witnessed commands (witness.py: the
SLOT_TOKEN each command saw) run on both nodes, then:

- the Redis clock steps back a day and FLUSHALL empties it: tokens restart from max(counter + 1, TIME),
  with the counter gone and TIME a day behind, unless every node's heartbeat carries the highest token
  it passed on (its floor) and the pool's recovery window (the full node TTL: nobody is registered after
  a FLUSHALL) lets every live node tick before the first grant;
- redis-server restarted without its data (no persistence), its clock still a day behind: the same.

Every token after is above every token before, and the witness sees no slot held twice, tokens unique
and increasing along each slot. Skipped (77) without redis-server or shared pools.

A brokerd host whose wall clock steps (a day back, then two forward, through the same shim) while its
command holds the only slot and another node's waits: the lease is renewed throughout and the slot goes
on with a greater token. brokerd's deadlines are on CLOCK_MONOTONIC/CLOCK_BOOTTIME and a shared pool's
clock is Redis's TIME (brokerd(8), RESTART BEHAVIOUR).

Usage: test-shared-tokens.py BROKERD SLOTCTL CLOCKSHIFT [unittest arguments]
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
from harness import wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402
from witness import Witness  # noqa: E402

TTL = 6  # seconds: backend-node-ttl, the recovery window of a pool made anew
DAY = 86400
SLOTCTL = None
CLOCKSHIFT = None


def config(backend, node):
    return harness.shared_pool_config(backend, node, TTL)


class TokensNeverGoBack(harness.BrokerTestCase):

    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-tokens-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.shift_file = os.path.join(self.tmp, "clockshift")
        self.shift(0)
        self.redis = RedisServer(self.tmp)
        self.redis.env = {"LD_PRELOAD": CLOCKSHIFT, "CLOCKSHIFT_FILE": self.shift_file}
        self.redis.start()
        self.addCleanup(self.redis.close)
        self.witness = Witness(self.tmp)

    def shift(self, seconds):
        tmp = self.shift_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{seconds}\n")
        os.rename(tmp, self.shift_file)

    def redis_behind(self, seconds):
        """Until Redis's TIME is `seconds` behind this host's clock (a condition: the shim reads its file
        at every call)."""
        def behind():
            sec, _ = self.redis.call("TIME")
            return time.time() - int(sec) > seconds - 60 or None
        wait_for(behind, timeout=10, message=f"redis-server's clock {seconds} s behind")

    def run_on(self, broker, name):
        """A witnessed `slotctl run` on broker, to its end (the first of a pool made anew waits out its
        window); returns the token its command saw."""
        deadline = time.monotonic() + TTL + 60
        while True:
            # A node that found the pool gone registers again, and refuses it meanwhile (unavailable,
            # "backend", exit 75): run again once its backend is up.
            wait_for(lambda: broker.pool("shared")["backend"]["up"], timeout=30, message=f"{broker.name}: backend up")
            p = subprocess.run([SLOTCTL, "run", "--socket", broker.socket_path, "--lane", "ci", "--job", name,
                                "--quiet", "--", *self.witness.command("true", name)],
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TTL + 60)
            if p.returncode != 75 or "backend" not in p.stderr or time.monotonic() > deadline:
                break
        self.assertEqual(p.returncode, 0, f"{name}: {p.stderr}")
        [start] = self.witness.started(name)
        return start.token

    def test_tokens_stay_above_after_redis_lost_its_data_a_day_behind(self):
        a = self.broker(config(self.redis.url(), "node-a"), "tokens-a")
        b = self.broker(config(self.redis.url(), "node-b"), "tokens-b")
        before = [self.run_on(x, f"{x.name}-{i}") for i in range(2) for x in (a, b)]
        self.assertEqual(before, sorted(before))

        # The Redis host's clock steps back a day, then Redis loses everything (FLUSHALL).
        self.shift(-DAY)
        self.redis_behind(DAY)
        self.redis.call("FLUSHALL")
        flushed = [self.run_on(x, f"{x.name}-flushed") for x in (b, a)]
        self.assertGreater(min(flushed), max(before), f"tokens went back after FLUSHALL: {before} then {flushed}")

        # A restart without persistence, its clock still a day behind.
        self.redis.restart(keep_data=False)
        self.redis_behind(DAY)
        restarted = [self.run_on(x, f"{x.name}-restarted") for x in (a, b)]
        self.assertGreater(min(restarted), max(before + flushed),
                           f"tokens went back after a restart without data: {before + flushed} then {restarted}")
        self.witness.check_shared(self, {"shared": 1})


    def test_a_brokerd_whose_clock_steps_keeps_its_lease_and_its_tokens(self):
        """brokerd A's wall clock steps back a day, then forward two, while its command holds the only slot
        and B's waits: A's lease is renewed throughout (its command is not fenced: deadlines are on the
        monotonic and boot clocks), B's command gets the slot when A's ends, with a greater token."""
        a = harness.Broker(config(self.redis.url(), "node-a"), name="steps-a")
        a_shift = os.path.join(self.tmp, "clockshift-a")
        with open(a_shift, "w") as f:
            f.write("0\n")
        # Under the sanitizers the runtime must come first in the library list: told not to mind the shim.
        a.env = {"LD_PRELOAD": CLOCKSHIFT, "CLOCKSHIFT_FILE": a_shift, "ASAN_OPTIONS": "verify_asan_link_order=0"}
        a.start()
        self.addCleanup(self.stop_broker, a)
        b = self.broker(config(self.redis.url(), "node-b"), "steps-b")
        first = self.run_on(a, "a-first")  # waits out the new pool's window

        held = subprocess.Popen([SLOTCTL, "run", "--socket", a.socket_path, "--lane", "ci", "--quiet", "--",
                                 *self.witness.command_until_stopped("a-held")],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.addCleanup(held.wait, 10)
        self.addCleanup(self.witness.stop, "a-held")
        [start] = wait_for(lambda: self.witness.started("a-held"), timeout=30, message="A's command started")
        waiter = subprocess.Popen([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "ci", "--quiet", "--",
                                   *self.witness.command("true", "b-after")],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.addCleanup(waiter.wait, 10)
        wait_for(lambda: b.status()["waiters"] or None, timeout=10, message="B's command waiting")
        for seconds in (-DAY, DAY):
            with open(a_shift + ".tmp", "w") as f:
                f.write(f"{seconds}\n")
            os.rename(a_shift + ".tmp", a_shift)
            # Past a whole node TTL: a lease whose renewals followed the wall clock would be fenced by now.
            deadline = time.monotonic() + TTL + 2
            while time.monotonic() < deadline:
                self.assertIsNone(held.poll(), held.stderr.read() if held.poll() is not None else "")
                self.assertEqual(self.witness.started("b-after"), [])
                time.sleep(0.2)
        self.witness.stop("a-held")
        self.assertEqual(held.wait(10), 0, held.stderr.read())
        self.assertEqual(waiter.wait(30), 0, waiter.stderr.read())
        [after] = self.witness.started("b-after")
        self.assertLess(first, start.token)
        self.assertGreater(after.token, start.token)
        self.witness.check_shared(self, {"shared": 1})


if __name__ == "__main__":
    (_, SLOTCTL, CLOCKSHIFT), argv = harness.arguments(__doc__, 3)
    harness.main(argv)
