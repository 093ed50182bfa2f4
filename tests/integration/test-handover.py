#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A restart through systemd's file descriptor store loses no waiter (SPEC §3.4, issue 20 item 6), without
systemd: fdstore.py stands in for the store and brokerd.socket (harness.Broker mode "store": the test keeps
the listening socket, and each start gets it named "varlink" followed by the stored fds).

StandIn: the stand-in itself against a fake service (LISTEN_PID/FDS/FDNAMES, the order asked, duplicates,
hang-ups, FDSTOREREMOVE, FileDescriptorStoreMax, a stranger's message), so that what the other classes find
is brokerd's doing.

Handover:
- The issue's reproduction: a one-slot pool, a holder `slotctl run --lane nightly` and six waiters; three
  SIGTERM + start through the store while the jobs flow (the stored fds passed in arrival order, then
  newest first as systemd's list gives them, then shuffled as its hash set may; the second stop races the
  holder's release): every job ends with its own exit status, grants in queue order, fencing tokens
  increasing, no slot held twice (witness.py), no client lost its broker or queued again, the holder's lease
  still "held" (no reclaim), the waiters' places, waits and budgets unchanged, and a waiter's live position
  line (a terminal) goes on with new positions. Each stop stores the state first (sb-state), then every
  connection (sb-conn); each start flushes the store and empties the state memfd.
- A handed-over holder's connection is still its lease's life line: closing it (a raw client) or the end of
  the command (`slotctl run`) frees the slot at once, not after reclaim-grace (60 s here).
- A waiter whose client went away while brokerd was down (systemd drops its fd on EPOLLHUP) is not granted
  and holds nobody up. A holder whose command ended while brokerd was down: its connection is taken back
  and its Release (with the command's exit status) ends the lease, its slotctl exits with the command's
  status; if its slotctl is gone too, the lease ends once the store is taken back, not a reclaim grace later.
- FileDescriptorStoreMax= below the connections: those not kept re-queue, the others resume. A waiter's
  budget counts from its Acquire across the restart (refused at its time, not a budget later). A
  configuration changed across the restart: a waiter of a lane gone is answered, one of a grown pool granted,
  one whose user the lane no longer allows is not granted. A waiter whose budget ran out while brokerd
  was down is refused at the start also when the holder's command ended meanwhile (room), not granted.
  Without brokerd.socket (brokerd binds its socket, only the stored fds are passed): an idle stop leaves the
  state alone in the store, and the next start must not take it for its listening socket.
- A Metrics call waiting for its kind's rest at the stop is answered before the handover, not closed.
- Half a call sent before the stop and its rest after is answered; a thousand calls whose replies were not
  read before the stop are all answered, once each, in order. Acquires that come during the restart (on an
  idle connection after STOPPING=1, on a new connection in the backlog) queue behind the waiter handed over.
  An Acquire cut by the restart after its pidfd came is refused (or its connection closed), never taken
  without it.

Damaged: the stored state cut short, with a flipped byte, of version 2, of another boot, missing, empty
(taken once already), with waiters' entries out of range: those connections are closed, their `slotctl run`
queue again (stderr says so) and finish; the holder keeps its lease (from the lease log, reclaimed if its
connection was closed); nothing is granted twice; the store is flushed all the same. A state with one
connection listed twice, or a waiter's entry naming the holder's lease (the holder's own entry gone): every job
finishes with its own status and nothing is granted twice.

Without a store (no NOTIFY_SOCKET) a restart is as before: test-requeue.py.

Usage: test-handover.py BROKERD SLOTCTL [unittest arguments]   (test classes as unittest arguments)
"""
import array
import json
import os
import pty
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid

sys.dont_write_bytecode = True
import fdstore  # noqa: E402
import harness  # noqa: E402
from harness import pool_violations, wait_for  # noqa: E402
from witness import Witness  # noqa: E402

SLOTCTL = None


def _have_pty():
    try:
        master, slave = pty.openpty()
    except OSError:
        return False
    os.close(master)
    os.close(slave)
    return True


HAVE_PTY = _have_pty()
if not HAVE_PTY:
    print("no pseudo-terminal here (no /dev/pts): the live position line is not checked", file=sys.stderr)

# reclaim-grace long, so that a slot freed "at once" cannot be one freed by the grace running out.
CONFIG = """\
[broker]
reclaim-grace = 60s

[pool p]
limit = 1
queue-timeout = 10m

[lane nightly]
pools = p
policy = wait
"""

REQUEUED = "queued again"                 # cli/run.c, a waiter that lost its broker and queued anew
LOST = "lost the connection to the broker"
POSITION = re.compile(r"waiting for pool p: position (\d+) of (\d+)")


class HandoverCase(harness.BrokerTestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="handover-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.w = Witness(self.dir)
        self.jobs = {}

    def start_broker(self, config=CONFIG):
        return self.broker(config, "brokerd", mode="store")

    def job(self, b, name, status, body=None, tty=False):
        """`slotctl run --lane nightly --job NAME` of a witnessed command named NAME (until stop(NAME), or
        running the shell text `body`, which must not exit: the witness gives its slot back after it),
        exiting with `status` once the command has ended."""
        cmd = self.w.command_until_stopped(name) if body is None else self.w.command(body, name)
        j = harness.SlotctlRun(SLOTCTL, b.socket_path, "nightly", ["sh", "-c", f'"$@"; exit {status}', "sh", *cmd],
                               "--job", name, tty=tty)
        self.addCleanup(j.kill)
        self.jobs[name] = j
        return j

    def queued_job(self, b, name, status, **kw):
        """job(), once slotctl says it waits (so that jobs queue in the order they are made)."""
        j = self.job(b, name, status, **kw)
        wait_for(lambda: "waiting for" in j.stderr() or j.proc.poll() is not None, 10, message=f"{name} queued")
        self.assertIsNone(j.proc.poll(), j.stderr())
        return j

    def stderrs(self):
        return "".join(f"---- {n}:\n{j.stderr()}" for n, j in self.jobs.items())

    def waiters(self, b):
        """[(job, waitedMs, budgetMs)] of Status's waiters, by position (checked: 1..n, holders ≤ limit)."""
        s = b.status()
        violations, _ = pool_violations(s, "p", 1)
        self.assertEqual(violations, [], s)
        return [(w.get("job"), w["waitedMs"], w.get("budgetMs"))
                for w in sorted(s["waiters"], key=lambda w: w["position"])], s["holders"]

    def stop_into_store(self, b):
        """SIGTERM: brokerd exits 0 and leaves the state first, then its connections, in the store."""
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        names = b.store.names()
        self.assertEqual(b.store.ignored, [], "messages the store ignored")
        self.assertEqual(b.store.overflowed, 0)
        self.assertTrue(names and names[0] == "sb-state",
                        f"the store holds {names}: the state memfd first, then the connections, expected; "
                        f"brokerd said:\n{b.log()[-3000:]}")
        self.assertLessEqual(set(names), {"sb-state", "sb-conn"}, names)
        self.assertEqual(names.count("sb-state"), 1, names)
        return names

    def start_from_store(self, b, order="arrival", emptied=True):
        """Starts brokerd with the stored fds; waits until it has flushed the store (FDSTOREREMOVE of both
        names) and checks that the state memfd it took is empty (a state is never used twice)."""
        b.fd_order = order
        state = b.store.dup("sb-state") if emptied and "sb-state" in b.store.names() else None
        try:
            b.start()
            b.store.wait_for(lambda s: s.count() == 0, 10, "brokerd to flush the store (FDSTOREREMOVE=1)")
            if state is not None:
                self.assertEqual(os.fstat(state).st_size, 0, "the state memfd brokerd took back is not emptied")
        finally:
            if state is not None:
                os.close(state)

    def restart(self, b, order="arrival"):
        names = self.stop_into_store(b)
        self.start_from_store(b, order)
        return names

    def assert_nobody_requeued(self):
        for name, j in self.jobs.items():
            err = j.stderr()
            self.assertNotIn(LOST, err, f"{name} lost its broker:\n{self.stderrs()}")
            self.assertNotIn(REQUEUED, err, f"{name} queued again:\n{self.stderrs()}")


class StandIn(HandoverCase):
    """fdstore.py against a fake service, which reports what it was passed and stores what the test says."""

    FAKE = r"""
import array, json, os, socket, sys, time
n = int(os.environ.get("LISTEN_FDS", "0"))
fds = {i: os.readlink(f"/proc/self/fd/{i}") for i in range(3, 3 + n + 8) if os.path.exists(f"/proc/self/fd/{i}")}
print(json.dumps({"pid": os.getpid(), "listen_pid": os.environ.get("LISTEN_PID"), "n": n,
                  "names": os.environ.get("LISTEN_FDNAMES"), "fds": fds}), flush=True)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
def notify(text, fds=()):
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
    sock.sendmsg([text.encode()], anc, 0, os.environ["NOTIFY_SOCKET"])
keep = []
for line in open(sys.argv[1]).read().splitlines():
    what, *args = line.split()
    if what == "memfd":          # memfd NAME TEXT
        fd = os.memfd_create(args[0]); os.write(fd, args[1].encode()); notify(f"FDSTORE=1\nFDNAME={args[0]}", [fd])
    elif what == "pairs":        # pairs NAME N HUP: N socket pairs, one end stored, the other kept by a child
        pairs = [socket.socketpair() for _ in range(int(args[1]))]
        notify(f"FDSTORE=1\nFDNAME={args[0]}", [p[0].fileno() for p in pairs])
        notify(f"FDSTORE=1\nFDNAME={args[0]}", [pairs[0][0].fileno()])  # the same fd again
        if args[2] == "1":
            pairs[0][1].close()  # the first pair's peer hangs up
            pairs = pairs[1:]
        keep += [p[1] for p in pairs]
    elif what == "remove":
        notify(f"FDSTOREREMOVE=1\nFDNAME={args[0]}")
    elif what == "ready":
        notify("READY=1")
if keep:
    pid = os.fork()
    if pid == 0:
        os.setsid(); time.sleep(120); os._exit(0)  # holds the peers until the test kills it
    print(json.dumps({"keeper": pid}), flush=True)
"""

    def fake(self, max_fds=8192):
        test = self
        script = os.path.join(self.dir, "fake.py")
        with open(script, "w") as f:
            f.write(self.FAKE)
        self.actions = os.path.join(self.dir, "actions")

        class Fake(harness.Broker):
            def argv(self):
                return [sys.executable, script, test.actions]
        b = Fake(None, mode="store", store_max=max_fds)
        self.addCleanup(b.cleanup)
        return b

    def run_fake(self, b, actions):
        """Starts the fake, which does `actions`; returns what it was passed."""
        with open(self.actions, "w") as f:
            f.write(actions)
        seen = len(b.log().splitlines())
        b.start(wait=False)
        b.store.wait_sent(b.pid, "READY")
        b.proc.wait(10)
        b.stop()  # gone already: its log closed, what it sent handled
        lines = [json.loads(line) for line in b.log().splitlines()[seen:]]
        for line in lines[1:]:
            self.addCleanup(self.kill_keeper, line["keeper"])
        return lines[0]

    @staticmethod
    def kill_keeper(pid):
        os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(pid, 0)  # ours once the fake exited: harness.main() makes the test a subreaper
        except ChildProcessError:
            pass

    def test_passes_socket_then_stored_fds_as_systemd_does(self):
        b = self.fake()
        first = self.run_fake(b, "memfd sb-state {}\npairs sb-conn 3 1\nready\n")
        self.assertEqual(first["listen_pid"], str(first["pid"]))
        self.assertEqual((first["n"], first["names"]), (1, "varlink"))
        listener = f"socket:[{os.fstat(b.listener.fileno()).st_ino}]"
        self.assertEqual(first["fds"], {"3": listener})
        # The duplicate was suppressed; the first pair's peer hung up (it exited): dropped.
        b.store.wait_for(lambda s: s.count() == 3, 5, "the hung-up fd dropped")
        self.assertEqual(b.store.names(), ["sb-state", "sb-conn", "sb-conn"])
        self.assertIn(("duplicate", "sb-conn"), [e[:2] for e in b.store.log])
        self.assertIn(("hup", "sb-conn"), [e[:2] for e in b.store.log])
        self.assertEqual(b.store.read("sb-state"), b"{}")
        inodes = b.store.inodes()
        for order, expect in (("arrival", inodes), ("reversed", inodes[::-1])):
            b.fd_order = order
            second = self.run_fake(b, "ready\n")
            self.assertEqual(second["listen_pid"], str(second["pid"]))
            self.assertEqual(second["n"], 4)
            self.assertEqual(second["names"].split(":"), ["varlink"] + [
                {i: n for i, n in zip(inodes, b.store.names())}[x] for x in expect])
            self.assertEqual(second["fds"]["3"], listener)
            self.assertEqual([second["fds"][str(4 + i)] for i in range(3)],
                             [f"/memfd:sb-state (deleted)" if x == inodes[0] else f"socket:[{x}]" for x in expect])
            self.assertEqual(sorted(second["fds"]), [str(i) for i in range(3, 7)], "fds beyond LISTEN_FDS leaked")

    def test_remove_replace_max_and_strangers(self):
        b = self.fake(max_fds=3)
        self.run_fake(b, "memfd sb-state abc\npairs sb-conn 4 0\nready\n")
        self.assertEqual(b.store.count(), 3)
        self.assertGreaterEqual(b.store.overflowed, 1)
        b.store.replace("sb-state", b"xyz")
        self.assertEqual(b.store.read("sb-state"), b"xyz")
        self.assertEqual(b.store.names()[0], "sb-state")
        self.run_fake(b, "remove sb-conn\nready\n")
        self.assertEqual(b.store.names(), ["sb-state"])
        # Not the main pid (NotifyAccess=main): ignored, its fds closed.
        r, w = socket.socketpair()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendmsg([b"FDSTORE=1\nFDNAME=sb-conn"],
                      [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r.fileno()]).tobytes())], 0,
                      b.store.path)
        b.store.wait_for(lambda s: s.ignored, 5, "the stranger's message ignored")
        self.assertEqual(b.store.names(), ["sb-state"])
        r.close()
        w.close()


class Handover(HandoverCase):

    def test_three_restarts_while_jobs_flow(self):
        """The issue's reproduction, through the store."""
        b = self.start_broker()
        self.job(b, "job0", 10)
        wait_for(lambda: self.w.started("job0"), 10, message="job0's command")
        for i in range(1, 7):
            # The last one on a terminal, where there are terminals (a chroot may have no /dev/pts): its live
            # position line.
            self.queued_job(b, f"job{i}", 10 + i, tty=(i == 6 and HAVE_PTY))
        tail = self.jobs["job6"]

        def position_of_tail():
            found = POSITION.findall(tail.stderr())
            return tuple(map(int, found[-1])) if found else None

        def line_at(position):
            if HAVE_PTY:
                wait_for(lambda: position_of_tail() == (position, position), 10,
                         message=f"job6's line at position {position} of {position} (it goes on)")

        def started(name):
            try:
                wait_for(lambda: self.w.started(name), 20, message=f"{name}'s command")
            except AssertionError:
                self.fail(f"{name} did not start; brokerd:\n{b.log()[-3000:]}\nslotctl:\n{self.stderrs()}")

        line_at(6)

        # 1: while job0 holds and six wait; the fds passed in the order they were stored.
        before, [holder] = self.waiters(b)
        names = self.restart(b, "arrival")
        self.assertGreaterEqual(names.count("sb-conn"), 7, names)  # every job's connection
        after, [holder_after] = self.waiters(b)
        self.assertEqual([j for j, _, _ in after], [f"job{i}" for i in range(1, 7)], "queue order across the restart")
        self.assertEqual([x for _, _, x in after], [x for _, _, x in before], "budgets changed across the restart")
        for (job, waited0, _), (_, waited1, _) in zip(before, after):
            self.assertGreaterEqual(waited1, waited0, f"{job}'s wait started again")
        self.assertEqual(holder_after["lease"]["id"], holder["lease"]["id"])
        self.assertEqual(holder_after["lease"]["token"], holder["lease"]["token"])
        self.assertEqual(holder_after["state"], "held", "the holder's lease awaits a reclaim")
        self.w.stop("job0")
        started("job1")
        line_at(5)

        # 2: job1's command ends as SIGTERM goes (its release races the stop); newest first, as systemd.
        self.w.stop("job1")
        self.restart(b, "reversed")
        started("job2")
        line_at(4)

        # 3: while job2 holds; shuffled.
        b.fd_seed = 20
        self.restart(b, "shuffled")
        for i in range(2, 7):
            started(f"job{i}")
            self.w.stop(f"job{i}")

        for i in range(7):
            self.assertEqual(self.jobs[f"job{i}"].wait(30), 10 + i, self.stderrs())
        self.assertEqual([e.name for e in self.w.started()], [f"job{i}" for i in range(7)], "grants in queue order")
        self.assertEqual(len(self.w.ended()), 7)
        self.w.check(self)
        self.assertLessEqual(max(c for _, c, _ in self.w.holders()), 1)
        self.assert_nobody_requeued()

    def check_life_line(self, holder_is_slotctl):
        b = self.start_broker()
        if holder_is_slotctl:
            self.job(b, "holder", 0)
            wait_for(lambda: self.w.started("holder"), 10, message="the holder's command")
        else:
            raw = self.acquire(b, "nightly")
            raw.until_granted()
        waiter = self.queued_job(b, "waiter", 0, body="true")
        self.restart(b)
        _, [holder] = self.waiters(b)
        self.assertEqual(holder["state"], "held", "the holder's lease awaits a reclaim")
        if not holder_is_slotctl:
            try:
                self.assertIsNone(raw.conn.poll(0.2), "the holder's connection got a message")
            except harness.ConnectionClosed:
                self.fail(f"the holder's connection was closed; brokerd:\n{b.log()[-3000:]}")
        start = time.monotonic()
        if holder_is_slotctl:
            self.w.stop("holder")
        else:
            raw.close()
        # reclaim-grace is 60 s: a grant within 10 s is the lease's end seen on its connection.
        try:
            wait_for(lambda: self.w.started("waiter"), 10, message="the waiter's command")
        except AssertionError:
            self.fail(f"the slot was not freed when the holder's connection closed; brokerd:\n{b.log()[-3000:]}")
        self.assertLess(time.monotonic() - start, 10)
        self.assertEqual(waiter.wait(10), 0, waiter.stderr())
        if holder_is_slotctl:
            self.assertEqual(self.jobs["holder"].wait(10), 0)
        self.assert_nobody_requeued()
        self.w.check(self)

    def test_handed_over_connection_is_still_the_lease_life_line(self):
        self.check_life_line(holder_is_slotctl=False)

    def test_command_ending_after_the_restart_frees_the_slot_at_once(self):
        self.check_life_line(holder_is_slotctl=True)

    def test_waiter_gone_while_brokerd_was_down(self):
        b = self.start_broker()
        self.job(b, "holder", 0)
        wait_for(lambda: self.w.started("holder"), 10, message="the holder's command")
        gone = self.queued_job(b, "gone", 0, body="true")
        self.queued_job(b, "next", 0, body="true")
        self.stop_into_store(b)
        stored = b.store.count("sb-conn")
        gone.kill()  # its connection closes: systemd drops the stored fd (EPOLLHUP)
        del self.jobs["gone"]
        b.store.wait_for(lambda s: s.count("sb-conn") == stored - 1, 5, "the hung-up connection dropped")
        self.start_from_store(b)
        try:
            wait_for(lambda: [j for j, _, _ in self.waiters(b)[0]] == ["next"], 10, message="one waiter: next")
        except AssertionError:
            self.fail(f"waiters {self.waiters(b)[0]}; brokerd:\n{b.log()[-3000:]}")
        self.w.stop("holder")
        self.assertEqual(self.jobs["next"].wait(15), 0, self.stderrs())
        self.assertEqual(self.jobs["holder"].wait(10), 0, self.stderrs())
        self.assertEqual([e.name for e in self.w.started()], ["holder", "next"])
        self.assert_nobody_requeued()
        self.w.check(self)

    def holder_ended_in_store(self):
        """A brokerd stopped into the store while job "holder" (exit 3) holds and "next" waits; then the holder's
        command ends, reaped by its slotctl (the witness logs its end just before its shell exits): gone for the
        start's check of the lease's command. Returns the broker, down."""
        b = self.start_broker()
        self.job(b, "holder", 3)
        wait_for(lambda: self.w.started("holder"), 10, message="the holder's command")
        self.queued_job(b, "next", 0, body="true")
        self.stop_into_store(b)
        self.w.stop("holder")
        pid = self.jobs["holder"].proc.pid

        def reaped():
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                return self.w.ended("holder") and not f.read().split()
        wait_for(reaped, 10, message="the holder's command to end")
        return b

    def test_a_holder_whose_command_ended_while_brokerd_was_down(self):
        """The command ends while brokerd is down (a restart under load): its slotctl's Release, with the
        command's exit status, waits in the connection the fd store kept. The start restores the lease for that
        connection alone, takes it back, and the Release ends the lease with its status told (SPEC §3.6: a
        quarantine or a health job's restore is not lost to the restart); slotctl exits with the command's
        status, and the slot goes to the next job."""
        b = self.holder_ended_in_store()
        self.start_from_store(b)
        self.assertEqual(self.jobs["holder"].wait(10), 3, self.stderrs())
        self.assertEqual(self.jobs["next"].wait(15), 0, self.stderrs())
        self.assertEqual([e.name for e in self.w.started()], ["holder", "next"])
        self.assertNotIn("could not tell the broker", self.jobs["holder"].stderr())
        log = b.log()
        self.assertNotIn("cannot be resumed", log)
        self.assertIn("Restored 1 lease(s); 0 ended while brokerd was down.", log)
        self.assertIn("Took back 2 connection(s) from systemd's fd store: 1 waiting, 1 holding a lease; 0 closed.",
                      log)
        self.w.check(self)

    def test_a_holder_whose_command_ended_across_two_quick_restarts(self):
        """As above, and a second restart follows the first at once (before its slotctl's Release may have been
        read): the lease, held by its connection alone, is handed over again and ends with the status told."""
        b = self.holder_ended_in_store()
        self.restart(b)
        self.restart(b)
        self.assertEqual(self.jobs["holder"].wait(10), 3, self.stderrs())
        self.assertNotIn("could not tell the broker", self.jobs["holder"].stderr())
        self.assertEqual(self.jobs["next"].wait(15), 0, self.stderrs())
        self.assertEqual([e.name for e in self.w.started()], ["holder", "next"])
        self.assert_nobody_requeued()
        self.w.check(self)

    def test_a_holder_whose_command_and_connection_ended_while_brokerd_was_down(self):
        """As above, and its slotctl is gone too (its connection hung up in the store): the lease restored for
        that connection ends as soon as the store's connections are taken back, not after the reclaim grace."""
        b = self.start_broker()
        self.job(b, "holder", 3)
        wait_for(lambda: self.w.started("holder"), 10, message="the holder's command")
        self.queued_job(b, "next", 0, body="true")
        self.stop_into_store(b)
        stored = b.store.count("sb-conn")
        self.jobs.pop("holder").kill()  # slotctl and its command's group
        b.store.wait_for(lambda s: s.count("sb-conn") == stored - 1, 5, "the hung-up connection dropped")
        self.start_from_store(b)
        self.assertEqual(self.jobs["next"].wait(15), 0, self.stderrs())
        self.assertEqual([e.name for e in self.w.started()], ["holder", "next"])
        log = b.log()
        self.assertIn("released: it ended while brokerd was down", log)
        self.w.check(self)

    def test_store_too_small(self):
        """FileDescriptorStoreMax= below the connections (an operator's mistake): what the store could not
        keep closes, those clients queue again; the others resume; every job finishes, nothing twice."""
        b = self.broker(CONFIG, "brokerd", mode="store", store_max=3)  # the state and two connections
        self.job(b, "holder", 0)
        wait_for(lambda: self.w.started("holder"), 10, message="the holder's command")
        for i in range(1, 4):
            self.queued_job(b, f"w{i}", 10 + i, body="true")
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        self.assertEqual(b.store.count(), 3, b.store.names())
        self.assertGreaterEqual(b.store.overflowed, 2)
        self.start_from_store(b)
        # Two of the four connections were not kept: their clients lost the broker and came back.
        wait_for(lambda: sum(LOST in j.stderr() for j in self.jobs.values()) >= 2, 15,
                 message="two clients losing their connection")
        self.w.stop("holder")
        self.assertEqual(self.jobs["holder"].wait(15), 0, self.stderrs())
        for i in range(1, 4):
            self.assertEqual(self.jobs[f"w{i}"].wait(30), 10 + i, self.stderrs())
        self.assertEqual(self.w.started()[0].name, "holder")
        self.assertEqual(len(self.w.started()), 4)
        self.w.check(self)
        self.assertEqual(sum(LOST in j.stderr() for j in self.jobs.values()), 2, self.stderrs())

    def test_budgets_run_on_across_the_restart(self):
        """A waiter's budget counts from its Acquire, restart or not: one that ran out while brokerd was down
        is refused right after the start, one that runs out later at its time, not a budget later."""
        b = self.start_broker()
        holder = self.acquire(b, "nightly")
        holder.until_granted()
        t0 = time.monotonic()
        short = self.acquire(b, "nightly", queueWaitMs=2000)
        long = self.acquire(b, "nightly", queueWaitMs=6000)
        self.assertTrue(short.queued and long.queued, (short.msg, long.msg))
        self.stop_into_store(b)
        time.sleep(max(0.0, t0 + 3 - time.monotonic()))  # an outage of 3 s: not a synchronisation
        started = time.monotonic()
        self.start_from_store(b)
        for a, budget in ((short, 2.0), (long, 6.0)):
            try:
                a.until(lambda a: a.error, 10, "the refusal")
            except harness.ConnectionClosed:
                self.fail(f"a waiter's connection was closed; brokerd:\n{b.log()[-3000:]}")
            self.assertEqual(a.error, "io.slotbroker.QueueTimeout", a.msg)
            when = a.times[-1] - t0
            due = max(budget, started - t0)
            self.assertTrue(due - harness.EARLINESS <= when <= due + harness.LATENESS,
                            f"refused after {when:.3f} s, due at {due:.3f} s (budget {budget} s, started again at "
                            f"{started - t0:.3f} s)")

    def test_a_budget_that_ran_out_while_brokerd_was_down_is_not_granted_with_room(self):
        """The same with room at the start: the holder's command ended while brokerd was down (its Release, taken
        back with its connection, ends its lease as the waiters are taken back). The waiter
        whose budget ran out meanwhile is refused QueueTimeout (SPEC §3.3: never granted after its budget
        ended), not granted because the slot is free; the one behind it, whose budget runs on, is granted."""
        b = self.start_broker()
        self.job(b, "holder", 0)
        wait_for(lambda: self.w.started("holder"), 10, message="the holder's command")
        t0 = time.monotonic()
        short = self.acquire(b, "nightly", queueWaitMs=1000)
        long = self.acquire(b, "nightly", queueWaitMs=600000)
        self.assertTrue(short.queued and long.queued, (short.msg, long.msg))
        self.stop_into_store(b)
        self.w.stop("holder")
        pid = self.jobs["holder"].proc.pid

        def reaped():
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                return self.w.ended("holder") and not f.read().split()
        wait_for(reaped, 10, message="the holder's command to end")
        time.sleep(max(0.0, t0 + 1.2 - time.monotonic()))  # the short budget runs out while brokerd is down
        started = time.monotonic()
        self.start_from_store(b)
        try:
            short.until(lambda a: a.error or a.granted, 10, "an answer")
            self.assertEqual(short.error, "io.slotbroker.QueueTimeout",
                             f"{short.msg} after {short.times[-1] - t0:.3f} s (budget 1 s, started again at "
                             f"{started - t0:.3f} s)")
            long.until(lambda a: a.error or a.granted, 10, "an answer")
        except harness.ConnectionClosed:
            self.fail(f"a waiter's connection was closed; brokerd:\n{b.log()[-3000:]}")
        self.assertTrue(long.granted, long.msg)
        self.assertEqual(self.jobs["holder"].wait(10), 0, self.stderrs())
        self.assertIn("Restored 1 lease(s); 0 ended while brokerd was down.", b.log())

    def test_configuration_changed_across_the_restart(self):
        """An upgrade that also changes brokerd.conf: a waiter whose lane and pool are gone gets an answer (a
        refusal, or its connection closed: it queues again), not a wait for ever; a pool grown grants its
        waiter at once."""
        b = self.start_broker(CONFIG + "[pool q]\nlimit = 1\n\n[lane other]\npools = q\npolicy = wait\n")
        holders = [self.acquire(b, lane) for lane in ("nightly", "other")]
        for h in holders:
            h.until_granted()
        stays = self.acquire(b, "nightly")
        gone = self.acquire(b, "other")
        self.assertTrue(stays.queued and gone.queued, (stays.msg, gone.msg))
        self.stop_into_store(b)
        b.write_config(CONFIG.replace("limit = 1", "limit = 2"))
        self.start_from_store(b)
        try:
            stays.until_granted(10)
        except harness.ConnectionClosed:
            self.fail(f"the waiter of the grown pool lost its connection; brokerd:\n{b.log()[-3000:]}")
        try:
            gone.until(lambda a: a.error, 10, "a refusal")
        except harness.ConnectionClosed:
            pass  # closed: its client queues again, and is refused then
        except AssertionError:
            self.fail(f"the waiter of a lane gone still waits: {gone.msg}; brokerd:\n{b.log()[-3000:]}")
        self.assertEqual([w for w in b.status()["waiters"]], [])
        b.responsive()

    def test_newcomers_during_the_restart_queue_behind(self):
        """Waiters keep their place: an Acquire on a connection made while brokerd is down (the backlog), and
        one sent on an idle connection after the stop began, queue behind the waiter handed over."""
        b = self.start_broker()
        holder = self.acquire(b, "nightly")
        holder.until_granted()
        kept = self.acquire(b, "nightly")
        self.assertTrue(kept.queued, kept.msg)
        idle = b.connect(10)
        self.addCleanup(idle.close)
        idle.call("org.varlink.service.GetInfo")
        pid = b.pid
        b.proc.send_signal(signal.SIGTERM)
        b.store.wait_sent(pid, "STOPPING")
        idle.send("io.slotbroker.Acquire", {"lane": "nightly"}, more=True)  # brokerd reads no more calls
        self.stop_into_store(b)
        newcomer = harness.Varlink(b.socket_path, 10)  # into the listening socket's backlog
        self.addCleanup(newcomer.close)
        newcomer.send("io.slotbroker.Acquire", {"lane": "nightly"}, more=True)
        self.start_from_store(b)
        late = harness.Acquisition(idle, idle.recv(10))
        new = harness.Acquisition(newcomer, newcomer.recv(10))
        self.assertTrue(late.queued and new.queued, (late.msg, new.msg))
        self.assertEqual(sorted([late.params["position"], new.params["position"]]), [2, 3],
                         "the waiter handed over is not first")
        holder.close()
        kept.until_granted()
        for a in (late, new):
            self.assertFalse(a.granted)
        kept.close()
        first = late if late.params["position"] == 2 else new
        first.until_granted()

    def test_a_lane_closed_to_a_waiter_across_the_restart(self):
        """allow-users= narrowed while brokerd was down (an upgrade with a new brokerd.conf): a waiter of a user
        the lane no longer allows is not granted after the start (refused, or its connection closed)."""
        if os.geteuid() != 0:
            self.skipTest("runs a client as nobody")
        b = self.start_broker()
        holder = self.acquire(b, "nightly")
        holder.until_granted()
        other = harness.spawn_client_as(b.socket_path, "io.slotbroker.Acquire", {"lane": "nightly"})
        self.addCleanup(harness.stop_client, other)
        first = harness.read_json_line(other, 10)
        self.assertEqual((first.get("parameters") or {}).get("state"), "queued", first)
        self.stop_into_store(b)
        b.write_config(CONFIG.replace("policy = wait", "policy = wait\nallow-users = root"))
        self.start_from_store(b)
        holder.close()
        try:
            msg = harness.read_json_line(other, 5)
        except AssertionError:
            msg = None  # nothing within 5 s: at least not granted; Status says whether it still waits
        self.assertFalse(msg and (msg.get("parameters") or {}).get("state") == "granted",
                         f"a waiter the lane no longer allows was granted: {msg}; brokerd:\n{b.log()[-2000:]}")
        self.assertEqual([w.get("uid") for w in b.status()["waiters"]], [],
                         f"a waiter the lane no longer allows still waits (client got {msg})")

    def test_restart_without_a_socket_unit(self):
        """A service with an fd store but no brokerd.socket (brokerd binds its socket itself): what is stored is
        all that is passed; an idle stop leaves the state alone in the store (LISTEN_FDS=1, "sb-state"), which
        is no listening socket; a stop with a waiter hands it over as with the socket unit."""
        b = self.broker(CONFIG, "brokerd", mode="store", socket_unit=False)
        self.stop_into_store(b)
        try:
            self.start_from_store(b)
        except AssertionError as e:
            self.fail(f"no start after an idle stop: {e}; passed {b.passed}; brokerd:\n{b.log()[-2000:]}")
        self.job(b, "holder", 0)
        wait_for(lambda: self.w.started("holder"), 10, message="the holder's command")
        waiter = self.queued_job(b, "waiter", 0, body="true")
        self.restart(b)
        self.w.stop("holder")
        self.assertEqual(waiter.wait(15), 0, self.stderrs())
        self.assertEqual(self.jobs["holder"].wait(10), 0, self.stderrs())
        self.assert_nobody_requeued()
        self.w.check(self)

    def test_a_call_cut_by_the_restart_with_its_pidfd(self):
        """An Acquire whose pidfd came (SCM_RIGHTS, with its first byte) before the stop and whose end came after:
        the state carries the bytes, not the fd. The call must not be taken with a pidfd it no longer has (or
        another fd in its place): an error, or the connection closed (the client asks again)."""
        b = self.start_broker()
        holder = self.acquire(b, "nightly")
        holder.until_granted()
        command = harness.Child()
        self.addCleanup(command.kill)
        pidfd = os.pidfd_open(command.pid)
        c = b.connect(10)
        self.addCleanup(c.close)
        call = harness.Varlink.encode_call("io.slotbroker.Acquire", {"lane": "nightly", "pidfd": 0}, more=True)
        before = b.pidfd_count()
        socket.send_fds(c.sock, [call[:-1]], [pidfd])
        os.close(pidfd)
        wait_for(lambda: b.pidfd_count() > before, 10, message="brokerd holding the pidfd of the unfinished call")
        self.stop_into_store(b)
        try:
            c.send_raw(call[-1:])  # while brokerd is down
        except OSError:
            return  # not handed over: closed at the stop
        self.start_from_store(b)
        try:
            msg = c.recv(10)
        except harness.ConnectionClosed:
            return
        self.assertIn("error", msg, f"the call was taken without its pidfd: {msg}; brokerd:\n{b.log()[-2000:]}")

    def test_partial_input_and_unread_output_cross_the_restart(self):
        b = self.start_broker()
        call = harness.Varlink.encode_call("io.slotbroker.Status")
        half = b.connect(10)
        self.addCleanup(half.close)
        half.send_raw(call[:len(call) // 2])
        reader = b.connect(10)
        self.addCleanup(reader.close)
        calls = 1000
        reader.send_raw(call * calls)
        # Replies pile up unread: our receive buffer fills and brokerd keeps the rest (or the calls).
        wait_for(lambda: self.unread(reader) > 100_000, 10, message="replies piling up unread")
        self.stop_into_store(b)
        try:
            half.send_raw(call[len(call) // 2:])  # while brokerd is down
        except OSError as e:
            self.fail(f"a connection with half a call was not kept: {e!r}; brokerd:\n{b.log()[-3000:]}")
        self.start_from_store(b)
        params, _ = half.reply(10)
        self.assertIn("pools", params)
        for i in range(calls):
            try:
                params, continues = reader.reply(10)
            except (TimeoutError, harness.ConnectionClosed) as e:
                self.fail(f"reply {i + 1} of {calls}: {e!r}; brokerd:\n{b.log()[-3000:]}")
            self.assertIn("pools", params)
            self.assertFalse(continues)
        self.assertIsNone(reader.poll(0.3), "a reply more than the calls")
        self.assertIn("io.slotbroker", reader.call("org.varlink.service.GetInfo")["interfaces"])

    def test_a_view_call_resting_at_the_stop_is_answered(self):
        """A Metrics call that waits for its kind's rest (nine times what the last rendering took) when SIGTERM
        comes is answered before the handover: a connection waiting for a reply cannot be handed over, and was
        closed (its client lost its broker)."""
        members = " ".join(f"rig-{i:04d}" for i in range(3000))
        b = self.start_broker(CONFIG + f"\n[pool rigs]\nmembers = {members}\n\n[lane l]\npools = rigs\n")
        first = b.connect(10)
        self.addCleanup(first.close)
        first.call("io.slotbroker.Metrics")  # a rendering of many members: its rest is some tenths of a second
        resting = b.connect(10)
        self.addCleanup(resting.close)
        resting.send_raw(harness.Varlink.encode_call("io.slotbroker.Metrics"))
        # A call on another connection answered after it: the loop has read the resting one's too.
        b.status()
        self.stop_into_store(b)
        self.start_from_store(b)
        try:
            params, _ = resting.reply(10)
        except (TimeoutError, harness.ConnectionClosed) as e:
            self.fail(f"the Metrics call resting at the stop: {e!r}; brokerd:\n{b.log()[-3000:]}")
        self.assertIn("slotbroker_member_grants_total", params["text"])

    @staticmethod
    def unread(conn):
        import fcntl
        import termios
        buf = array.array("i", [0])
        fcntl.ioctl(conn.fileno(), termios.FIONREAD, buf)
        return buf[0]


def other_boot(state):
    old = json.loads(state)["boot"]
    new = uuid.uuid4()
    return str(new) if "-" in old else new.hex


def waiters_out_of_range(state):
    """Every waiter's entry asking for 0 slots (what no Acquire may ask)."""
    obj = json.loads(state)
    touched = 0
    for c in obj["connections"]:
        if "waiting" in c.get("acquire", {}):
            c["acquire"]["slots"] = 0
            touched += 1
    assert touched, f"no waiter's entry in the state: {obj}"
    return json.dumps(obj).encode()


def a_connection_twice(state):
    """The first waiter's entry listed twice (two entries for one socket)."""
    obj = json.loads(state)
    waiting = [c for c in obj["connections"] if "waiting" in c.get("acquire", {})]
    assert waiting, f"no waiter's entry in the state: {obj}"
    obj["connections"].append(json.loads(json.dumps(waiting[0])))
    return json.dumps(obj).encode()


def a_lease_claimed_by_another(state):
    """The first waiter's entry made the holder's (its lease), and the holder's own entry gone: a socket that
    never held the lease names it. (Both entries naming it is the same, half the time: the first one wins.)"""
    obj = json.loads(state)
    waiting = [c for c in obj["connections"] if "waiting" in c.get("acquire", {})]
    holding = [c for c in obj["connections"] if "lease" in c.get("acquire", {})]
    assert waiting and holding, f"no waiter's or no holder's entry in the state: {obj}"
    waiting[0]["acquire"] = json.loads(json.dumps(holding[0]["acquire"]))
    obj["connections"].remove(holding[0])
    return json.dumps(obj).encode()


class Damaged(HandoverCase):
    """What is stored is not to be trusted: the connections without a valid entry are closed and re-queue."""

    def check_requeued(self, tamper):
        b = self.start_broker()
        self.job(b, "holder", 0)
        wait_for(lambda: self.w.started("holder"), 10, message="the holder's command")
        w1 = self.queued_job(b, "w1", 11, body="true")
        w2 = self.queued_job(b, "w2", 12, body="true")
        self.stop_into_store(b)
        tamper(b.store)
        self.start_from_store(b, emptied=False)
        for j in (w1, w2):
            try:
                wait_for(lambda: REQUEUED in j.stderr() or j.proc.poll() is not None, 15, message="a re-queue")
            except AssertionError:
                pass
            self.assertIn(REQUEUED, j.stderr(), f"brokerd:\n{b.log()[-3000:]}\nslotctl:\n{self.stderrs()}")
        self.assertFalse(self.w.started("w1") or self.w.started("w2"), "a waiter ran while the holder held the slot")
        _, holders = self.waiters(b)
        self.assertEqual(len(holders), 1, holders)
        self.w.stop("holder")
        self.assertEqual(self.jobs["holder"].wait(15), 0, self.stderrs())
        self.assertEqual(w1.wait(30), 11, self.stderrs())
        self.assertEqual(w2.wait(30), 12, self.stderrs())
        self.assertEqual(self.w.started()[0].name, "holder")
        self.assertEqual(sorted(e.name for e in self.w.started()), ["holder", "w1", "w2"])
        self.w.check(self)
        return b

    def check_safe(self, tamper):
        """A state that may be partly usable: whatever brokerd makes of it, every job finishes with its own
        status, nothing is granted twice, and brokerd stays up and exits cleanly."""
        b = self.start_broker()
        self.job(b, "holder", 0)
        wait_for(lambda: self.w.started("holder"), 10, message="the holder's command")
        w1 = self.queued_job(b, "w1", 11, body="true")
        w2 = self.queued_job(b, "w2", 12, body="true")
        self.stop_into_store(b)
        tamper(b.store)
        self.start_from_store(b, emptied=False)
        self.assertFalse(self.w.started("w1") or self.w.started("w2"), "a waiter ran while the holder held the slot")
        self.w.stop("holder")
        for name, j, status in (("holder", self.jobs["holder"], 0), ("w1", w1, 11), ("w2", w2, 12)):
            try:
                self.assertEqual(j.wait(30), status, self.stderrs())
            except Exception as e:
                self.fail(f"{name}: {e!r}; brokerd:\n{b.log()[-3000:]}\nslotctl:\n{self.stderrs()}")
        self.assertEqual(self.w.started()[0].name, "holder")
        self.assertEqual(sorted(e.name for e in self.w.started()), ["holder", "w1", "w2"])
        self.w.check(self)
        b.responsive()

    def test_a_connection_listed_twice(self):
        self.check_safe(lambda s: s.replace("sb-state", a_connection_twice(s.read())))

    def test_a_lease_claimed_by_a_connection_that_never_held_it(self):
        """Only the connection that held the lease may be re-linked to it (a state is not to be trusted to say
        which: the socket's peer, as SO_PEERCRED gives it, against what the lease log knows of its client):
        another's connection is closed and queues again, the holder reclaims its lease."""
        self.check_safe(lambda s: s.replace("sb-state", a_lease_claimed_by_another(s.read())))

    def test_state_cut_short(self):
        self.check_requeued(lambda s: s.replace("sb-state", fdstore.state_cut_short(s.read())))

    def test_state_with_a_flipped_byte(self):
        self.check_requeued(lambda s: s.replace("sb-state", fdstore.state_flipped(s.read())))

    def test_state_of_a_newer_format(self):
        self.check_requeued(lambda s: s.replace("sb-state", fdstore.state_edited(s.read(), version=99)))

    def test_state_of_another_boot(self):
        self.check_requeued(lambda s: s.replace("sb-state", fdstore.state_edited(s.read(), boot=other_boot(s.read()))))

    def test_no_state(self):
        """A crash between storing the connections and the state (or a state systemd lost)."""
        self.check_requeued(lambda s: s.remove("sb-state"))

    def test_empty_state(self):
        """A state taken back once already (brokerd empties it) and offered again after a crash."""
        self.check_requeued(lambda s: s.replace("sb-state", b""))

    def test_waiters_entries_out_of_range(self):
        self.check_requeued(lambda s: s.replace("sb-state", waiters_out_of_range(s.read())))


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
