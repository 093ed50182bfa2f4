#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""brokerd fences a shared pool's lease itself when slotctl is gone (issue 19 d, SPEC §11 "Fencing does not
depend on slotctl alone").

- slotctl run on node A, its command in its own process group; slotctl SIGKILLed (a CI runner cancelling a
  job); then A cut off from Redis (a TCP proxy that blackholes). Redis frees A's slot a node TTL after A's
  last heartbeat and B's waiting command takes it: A's command must be gone before then. brokerd holds the
  command's pidfd: at its self-fence deadline it sends the group SIGTERM (SIGKILL after revoke-grace), the
  revocation is in A's history ("revoked", brokerd stops its command), and the witness (witness.py) sees the
  end of A's command before the start of B's, never both at once.
- The same with a command that ignores SIGTERM: SIGKILL after revoke-grace, still before Redis frees it.
- `slotctl acquire --detach` on a shared pool: nobody could fence it, so it is refused (InvalidParameter,
  slotctl exits 64) with a message that says why; on a local pool it is granted as before.
- SPEC §3.4 on a shared pool: A's lease-log line of such a command's lease is damaged while A is down. A
  restarts without the lease (state.damaged), so nobody can fence the command; its first reconcile used to
  make the lease an orphan that lapsed a TTL later, and B granted the slot while the command ran. Redis now
  keeps it as A's while the file exists, and hands it on only a TTL after the file is removed.
- A restarted with a longer backend-node-ttl= (a change B does not want, so Redis keeps the old one) while its
  command runs: the restored lease fences on the TTL Redis enforces, not the configured one; cut off from
  Redis, A's command is gone before B's command gets the slot.

Usage: test-shared-fence.py BROKERD SLOTCTL [unittest arguments]
"""
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
from harness import reap, wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402
from tcpproxy import TcpProxy  # noqa: E402
from witness import Witness  # noqa: E402

SLOTCTL = None
TTL = 6.0  # the shortest backend-node-ttl a revoke-grace of 1 s allows: a fence 3 s after the last ack


def config(backend, node, ttl=TTL):
    return f"""\
[broker]
node-name = {node}
revoke-grace = 1s

[pool one]
limit = 1
backend = {backend}
backend-node-ttl = {ttl:g}s

[pool here]
limit = 1

[lane one]
pools = one
policy = wait

[lane here]
pools = here

[lane probe]
pools = one
policy = fail-fast
"""


class TestSharedFence(harness.BrokerTestCase):
    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-fence-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.redis = RedisServer(self.tmp).start()
        self.addCleanup(self.redis.close)
        self.proxy = TcpProxy(self.redis.address).start()
        self.addCleanup(self.proxy.close)
        self.witness = Witness(self.tmp)

    def brokers(self):
        a = self.broker(config(self.proxy.url(), "node-a"), "fence-a")
        b = self.broker(config(self.redis.url(), "node-b"), "fence-b")
        for node in (a, b):  # until then a node refuses the pool at once
            wait_for(lambda: node.pool("one")["backend"]["up"], timeout=30, message=f"{node.name}: the backend up")
        return a, b

    def run_witness(self, broker, name, body, *options):
        p = subprocess.Popen([SLOTCTL, "run", "--socket", broker.socket_path, "--lane", "one", "--quiet",
                              "--kill-after", "1s", *options, "--", *self.witness.command(body, name)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.addCleanup(p.stderr.close)
        self.addCleanup(lambda: p.poll() is None and (p.kill(), p.wait()))
        return p

    def times(self):
        """{(what, name): realtime s} from the witness's times file."""
        out = {}
        with open(os.path.join(self.tmp, "times")) as f:
            for line in f.read().split("\n")[:-1]:
                stamp, what, name = line.split()
                out.setdefault((what, name), float(stamp))
        return out

    def command_pids(self, name):
        """The pids of the witness command `name` (its shell and what it runs), from /proc."""
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        argv = f.read().split(b"\0")
                except OSError:
                    continue
                if self.witness.script.encode() in argv and name.encode() in argv:
                    pids.append(int(entry))
        return pids

    def watch_death(self, pid):
        """A thread whose .at becomes the realtime instant pid exits (its pidfd readable)."""
        fd = os.pidfd_open(pid)

        def watch():
            select.select([fd], [], [])
            t.at = time.time()
            os.close(fd)
            reap(pid)  # ours since slotctl died (harness.main makes the test a subreaper)

        t = threading.Thread(target=watch, daemon=True)
        t.at = None
        t.start()
        return t

    def fence_orphan(self, body):
        a, b = self.brokers()
        on_a = self.run_witness(a, "on-a", body)
        # A pool's first use waits one TTL (its recovery window): a generous bound, never a sleep.
        wait_for(lambda: self.witness.started("on-a"), timeout=TTL + 30, message="the command on A to start")
        on_b = self.run_witness(b, "on-b", "sleep 0.1")
        wait_for(lambda: b.pool("one")["waiting"] or None, timeout=10, message="B's command to wait")

        # The runner cancels the job: slotctl is SIGKILLed, its command (a group of its own) runs on, and the
        # lease stays held by it alone (SPEC §3.4).
        on_a.kill()
        on_a.wait()
        pids = self.command_pids("on-a")
        self.assertTrue(pids, "the command on A died with slotctl")
        died = self.watch_death(min(pids))  # its shell, the group's leader
        self.addCleanup(lambda: harness.group_alive(min(pids)) and os.killpg(min(pids), signal.SIGKILL))
        wait_for(lambda: not a.client_connections() or None, timeout=10, message="slotctl's connection gone")
        self.assertEqual(a.pool("one")["inUse"], 1, "the lease ended with slotctl while its command runs")

        # Then A loses Redis. Redis frees A's slot a TTL after its last heartbeat; B's command takes it.
        self.proxy.blackhole()
        self.assertEqual(on_b.wait(TTL + 20), 0, on_b.stderr.read())
        times = self.times()
        died.join(5)
        self.assertIsNotNone(died.at, "A's command never ended: nobody fenced it")
        self.assertLess(died.at, times["start", "on-b"], "A's command still ran when B's command got the slot")
        # And before B's grant itself (B's history: realtime µs, the same clock as the death's).
        granted = [e["time"] for e in b.call("io.slotbroker.History", {})["events"] if e["decision"] == "granted"]
        self.assertEqual(len(granted), 1, granted)
        self.assertLess(died.at * 1e6, granted[0], "A's command still ran when B's brokerd granted the slot")
        wait_for(lambda: reap() or not self.command_pids("on-a") or None, timeout=5, message="A's command gone")
        self.witness.check_shared(self, {"one": 1})
        self.assertEqual([e.name for e in self.witness.started()], ["on-a", "on-b"])

        # Audited: the revocation in the history, and journaled with the reason that brokerd stops the command.
        self.assertEqual([e["decision"] for e in a.call("io.slotbroker.History", {})["events"]
                          if e["decision"] not in ("granted", "released")], ["revoked"])
        self.assertRegex(a.log(), r"\[LEASE_REVOKED\].*fenced; nobody holds it: brokerd stops its command")
        self.assertIn("nobody else stops its command: sent SIGTERM", a.log())
        # Once Redis is back, A gives the slot back (the lease ended with its command): B's next grant comes.
        self.proxy.passthrough()
        wait_for(lambda: reap() or a.pool("one")["inUse"] == 0 or None, timeout=TTL + 20, message="A's lease gone")
        return a, b

    def test_restart_with_a_longer_ttl_fences_on_the_agreed_one(self):
        a, b = self.brokers()
        on_a = self.run_witness(a, "on-a", "while true; do sleep 0.1; done", "--reclaim-for", "30s")
        wait_for(lambda: self.witness.started("on-a"), timeout=TTL + 30, message="the command on A to start")
        on_b = self.run_witness(b, "on-b", "sleep 0.1")
        wait_for(lambda: b.pool("one")["waiting"] or None, timeout=10, message="B's command to wait")

        self.assertEqual(a.stop(), 0)
        a.write_config(config(self.proxy.url(), "node-a", ttl=2 * TTL))
        a.start()
        wait_for(lambda: (a.pool("one")["backend"] or {}).get("unavailable") == "rules" and a.pool("one")["inUse"] == 1
                 or None, timeout=30, message="A to refuse the pool for its rules, its lease restored")
        # Cut off: Redis frees A's slot one TTL (its own, 6 s) after A's last heartbeat; B's command takes it.
        self.proxy.blackhole()
        self.assertEqual(on_b.wait(2 * TTL + 20), 0, on_b.stderr.read())
        self.assertEqual(on_a.wait(10), 124, on_a.stderr.read())  # revoked: fenced
        self.witness.check_shared(self, {"one": 1})  # A's command was gone when B's started
        self.assertEqual([e.name for e in self.witness.started()], ["on-a", "on-b"])

    def test_orphaned_command_is_fenced_by_brokerd(self):
        a, _ = self.fence_orphan('while true; do sleep 0.1; done')
        self.assertNotIn("SIGKILL", a.log(), "the command stopped on SIGTERM: nothing to kill")

    def test_orphaned_command_that_ignores_sigterm_is_killed(self):
        # A command that gives its slot back on SIGTERM (the witness's lock files) and runs on regardless.
        body = 'trap "finish; trap \\"\\" TERM" TERM; while true; do sleep 0.1; done'
        a, _ = self.fence_orphan(body)
        self.assertIn("sent SIGKILL", a.log())

    def test_a_damaged_lease_line_keeps_its_slot_held_in_redis_until_its_file_is_removed(self):
        a, b = self.brokers()
        on_a = self.run_witness(a, "on-a", "while true; do sleep 0.1; done")
        wait_for(lambda: self.witness.started("on-a"), timeout=TTL + 30, message="the command on A to start")
        lease = a.status()["holders"][0]["lease"]
        # slotctl goes (the command runs on, held by A alone), then A crashes: its lease log keeps the lease.
        on_a.kill()
        on_a.wait()
        pids = self.command_pids("on-a")
        self.assertTrue(pids, "the command on A died with slotctl")
        self.addCleanup(lambda: harness.group_alive(min(pids)) and os.killpg(min(pids), signal.SIGKILL))
        wait_for(lambda: not a.client_connections() or None, timeout=10, message="slotctl's connection gone")
        a.crash()
        harness.damage_lease_line(a.state_dir, lease["id"])

        a.start()
        wait_for(lambda: a.pool("one")["backend"]["up"], timeout=30, message="A's backend up again")
        self.assertIn("1 damaged line(s) skipped", a.log())
        self.assertEqual(a.status()["holders"], [], "A cannot name the lease")
        # A's registering tick carried its whole reconcile: Redis kept the lease as A's, no orphan to lapse.
        self.assertEqual(self.redis.call("ZCARD", "{sb:one}:orph"), 0, "the lease became an orphan")
        self.assertEqual(self.redis.call("HLEN", "{sb:one}:h"), 1)
        # Past a TTL (when an orphan would have lapsed), the slot is still held: B's request is refused.
        held_until = time.monotonic() + TTL + 2
        while True:
            probe = subprocess.run([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "probe", "--", "true"],
                                   capture_output=True, text=True, timeout=30)
            self.assertEqual(probe.returncode, 75, "B was granted the slot A's command holds: " + probe.stderr)
            if time.monotonic() > held_until:
                break
            time.sleep(1)  # a request a second: what a CI runner's retries look like
        self.assertTrue(harness.group_alive(min(pids)), "the command on A ended by itself")

        # The operator stops the job, then removes the file: the lease becomes an orphan, and lapses one TTL on.
        os.killpg(min(pids), signal.SIGKILL)
        wait_for(lambda: reap() or not self.command_pids("on-a") or None, timeout=5, message="A's command gone")
        os.unlink(os.path.join(a.state_dir, "state.damaged"))
        wait_for(lambda: "state.damaged was removed: granting again" in a.log() or None, timeout=10,
                 message="A to see the file gone")
        wait_for(lambda: subprocess.run([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "probe", "--", "true"],
                                        capture_output=True, timeout=30).returncode == 0 or None,
                 timeout=TTL + 15, interval=0.5, message="B to get the slot a TTL after the file went")
        self.witness.check_shared(self, {"one": 1})

    def test_detached_lease_refused_on_shared_pool(self):
        a, _ = self.brokers()
        p = subprocess.run([SLOTCTL, "acquire", "--socket", a.socket_path, "--lane", "one", "--detach",
                            "--max-hold", "1h"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 64, p.stdout + p.stderr)
        self.assertIn("shared", p.stderr)
        self.assertEqual(a.pool("one")["inUse"], 0)
        p = subprocess.run([SLOTCTL, "acquire", "--socket", a.socket_path, "--lane", "here", "--detach",
                            "--max-hold", "1h"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
