#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A waiter outlives a restart of brokerd without a file descriptor store (SPEC §3.4, issue 20 item 3).

- A one-slot pool, one `slotctl run --lane nightly` holding it and a second one waiting; brokerd stopped
  (SIGTERM) or killed (SIGKILL) and started again on the same state directory: the waiter reconnects,
  queues again, says so on stderr, is granted once the holder ends and exits with its command's status.
- Three restarts while six jobs flow: every job ends with its own exit status, no slot held twice and
  fencing tokens increasing (witness.py).
- The broker stays away longer than --reclaim-for: 69. SIGINT while reconnecting: 130, the command never
  ran. --max-wait counts from the first Acquire: a wait queued again does not get a fresh one. A
  socket that answers garbage after the reconnect is not retried (exit 1, as at any time).

Usage: test-requeue.py BROKERD SLOTCTL [unittest arguments]
"""
import os
import signal
import socket
import threading
import sys
import tempfile
import time

sys.dont_write_bytecode = True
import harness  # noqa: E402
from harness import wait_for  # noqa: E402
from witness import Witness  # noqa: E402

SLOTCTL = None

CONFIG = """\
[broker]
reclaim-grace = 3s

[pool p]
limit = 1
queue-timeout = 10m

[lane nightly]
pools = p
policy = wait
"""


def Job(b, argv, *options):
    """`slotctl run --lane nightly` as a CI job runs it (stderr not a terminal), stderr kept in a file."""
    return harness.SlotctlRun(SLOTCTL, b.socket_path, "nightly", argv, *options)


class Requeue(harness.BrokerTestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="requeue-")
        self.w = Witness(self.dir)

    def job(self, b, argv, *options):
        j = Job(b, argv, *options)
        self.addCleanup(j.kill)
        return j

    def wait_stderr(self, job, text, timeout=15):
        wait_for(lambda: text in job.stderr() or job.proc.poll() is not None, timeout, message=repr(text))
        self.assertIn(text, job.stderr())

    def holder_and_waiter(self, b, *waiter_options, waiter_body="exit 0"):
        holder = self.job(b, self.w.command_until_stopped("holder"))
        wait_for(lambda: self.w.started("holder"), 10, message="the holder's command")
        waiter = self.job(b, self.w.command(waiter_body, "waiter"), *waiter_options)
        self.wait_stderr(waiter, "waiting for a slot")
        return holder, waiter

    def restart(self, b, how):
        if how == "SIGTERM":
            self.assertEqual(b.stop(), 0)
        else:
            b.crash()
        b.start()

    def check_requeued(self, how):
        b = self.broker(CONFIG, "brokerd")
        holder, waiter = self.holder_and_waiter(b)
        self.restart(b, how)
        self.wait_stderr(waiter, "queued again")
        self.assertFalse(self.w.started("waiter"), "the waiter ran while the holder held the only slot")
        self.w.stop("holder")
        self.assertEqual(holder.wait(), 0, holder.stderr())
        self.assertEqual(waiter.wait(), 0, waiter.stderr())
        err = waiter.stderr()
        self.assertEqual(err.count("lost the connection to the broker while waiting"), 1, err)
        self.assertEqual(err.count("reconnected to the broker; queued again"), 1, err)
        self.assertEqual([e.name for e in self.w.started()], ["holder", "waiter"])
        self.w.check(self)

    def test_waiter_requeues_after_sigterm(self):
        self.check_requeued("SIGTERM")

    def test_waiter_requeues_after_sigkill(self):
        self.check_requeued("SIGKILL")

    def test_three_restarts_while_six_jobs_flow(self):
        b = self.broker(CONFIG, "brokerd")
        jobs = []
        for i in range(6):
            # The witness ends (its slot given back), then the job's own status.
            jobs.append(self.job(b, ["sh", "-c", f'"$@"; exit {10 + i}', "sh",
                                     *self.w.command("sleep 0.3", f"job{i}")]))
            # In order, so that each queues behind the one before (grant order = arrival order).
            wait_for(lambda: self.w.started(f"job{i}") or "waiting for a slot" in jobs[-1].stderr(), 10,
                     message=f"job{i} in the queue")
        def stderrs():
            return "".join(f"---- job{i}:\n{j.stderr()}" for i, j in enumerate(jobs))
        for k, how in enumerate(("SIGTERM", "SIGKILL", "SIGTERM")):
            try:
                wait_for(lambda: len(self.w.started()) > k, 20, message=f"{k + 1} jobs started")
            except AssertionError:
                self.fail(f"{k + 1} jobs did not start; slotctl said:\n{stderrs()}")
            self.restart(b, how)
        for i, j in enumerate(jobs):
            self.assertEqual(j.wait(60), 10 + i, j.stderr())
        self.assertEqual(sorted(e.name for e in self.w.started()), [f"job{i}" for i in range(6)])
        self.assertEqual(len(self.w.ended()), 6)
        # The witness first: never two holders of the one slot, whatever the restarts did.
        self.w.check(self)
        self.assertLessEqual(max(c for _, c, _ in self.w.holders()), 1)
        # Each restart found jobs waiting (the last one at least the sixth): they asked again, and were queued
        # again, or granted at once where the slot had come free meanwhile (the holder's short command ended
        # while the broker restarted: a loaded machine's restart outlasts it).
        asked_again = sum(j.stderr().count("reconnected to the broker; queued again") +
                          j.stderr().count("reconnected to the broker; granted at once") for j in jobs)
        self.assertGreaterEqual(asked_again, 3, stderrs())

    def test_broker_away_longer_than_reclaim_for_is_69(self):
        b = self.broker(CONFIG, "brokerd")
        holder, waiter = self.holder_and_waiter(b, "--reclaim-for", "500ms")
        self.assertEqual(b.stop(), 0)
        start = time.monotonic()
        self.assertEqual(waiter.wait(10), 69, waiter.stderr())
        self.assertLess(time.monotonic() - start, 5)
        err = waiter.stderr()
        self.assertIn("reconnecting to queue again for up to 500ms", err)
        self.assertIn("within --reclaim-for=500ms", err)
        self.assertFalse(self.w.started("waiter"))
        # The holder's command runs on without the broker (what --reclaim-for did before, unchanged).
        self.w.stop("holder")
        self.assertEqual(holder.wait(), 0, holder.stderr())

    def test_interrupted_while_reconnecting_is_130(self):
        b = self.broker(CONFIG, "brokerd")
        holder, waiter = self.holder_and_waiter(b)
        self.assertEqual(b.stop(), 0)
        self.wait_stderr(waiter, "reconnecting to queue again")
        waiter.proc.send_signal(signal.SIGINT)
        self.assertEqual(waiter.wait(10), 130, waiter.stderr())
        self.assertFalse(self.w.started("waiter"))
        self.w.stop("holder")
        self.assertEqual(holder.wait(), 0, holder.stderr())

    def test_garbage_after_reconnect_is_not_retried(self):
        b = self.broker(CONFIG, "brokerd")
        holder, waiter = self.holder_and_waiter(b)
        self.assertEqual(b.stop(), 0)
        self.wait_stderr(waiter, "reconnecting to queue again")
        # Something else listens there now, and answers what is not Varlink to everyone: the holder's
        # slotctl reconnects too (to reclaim its lease), and may come first.
        if os.path.exists(b.socket_path):
            os.unlink(b.socket_path)
        conns = []
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(b.socket_path)
            server.listen()

            def answer_garbage():
                while True:
                    try:
                        conn, _ = server.accept()
                        conns.append(conn)
                        conn.sendall(b"not json\0")
                    except OSError:
                        return
            threading.Thread(target=answer_garbage, daemon=True).start()
            try:
                self.assertEqual(waiter.wait(10), 1, waiter.stderr())
            finally:
                server.shutdown(socket.SHUT_RDWR)
        for conn in conns:
            conn.close()
        os.unlink(b.socket_path)
        self.assertFalse(self.w.started("waiter"))
        self.w.stop("holder")
        self.assertEqual(holder.wait(), 0, holder.stderr())

    def test_max_wait_counts_from_the_first_acquire(self):
        b = self.broker(CONFIG, "brokerd")
        start = time.monotonic()
        holder, waiter = self.holder_and_waiter(b, "--max-wait", "3s")
        self.assertEqual(b.stop(), 0)
        self.wait_stderr(waiter, "reconnecting to queue again")
        time.sleep(max(0.0, start + 2 - time.monotonic()))  # an outage of 2 s: not a synchronisation
        restarted = time.monotonic()
        b.start()
        self.wait_stderr(waiter, "queued again")
        self.assertEqual(waiter.wait(15), 75, waiter.stderr())
        # A fresh 3 s budget from the restart would end 3 s after it at the earliest (5 s after the start);
        # the first acquire's ends about 3 s after the start.
        self.assertLess(time.monotonic(), restarted + 3)
        self.assertFalse(self.w.started("waiter"))
        self.w.stop("holder")
        self.assertEqual(holder.wait(), 0, holder.stderr())


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
