#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""No slot granted twice, whatever the process tree or the state directory does (SPEC §3.4).

Witnessed from the commands' side (witness.py): every command `slotctl run` starts takes an O_EXCL lock
file per slot it holds and logs its start and end. The check: no slot is held twice at once, and fencing
tokens, in the order commands started, only go up.

- Restart with every liveness shape of the held command (slotctl SIGKILLed first, then brokerd):
  leader running; leader exited with a member of its process group running; leader a zombie with a
  member running; leader a zombie alone (zombies run nothing: the slot frees), so before the restart and
  so while no brokerd ran; everything exited; a command sharing its client's group (watched by its leader
  alone). The restarted brokerd keeps exactly the slots the live one would.
  (Detached and connection-held leases: test-restart.py.)
- Fault injection on the lease log (leases.log), on the history database's files (history.db, -wal, -shm)
  and on all of them, at start and at run time: made immutable (chattr +i; skipped where the file system
  or the privileges do not allow it). brokerd restores what the lease log holds, grants nothing it could
  not write there (Unavailable, reason "storage"; Status still served), never dies (SIGBUS), recovers when
  the file is writable again, and the witness sees no slot held twice and no token going back. A history
  database that cannot be written costs decision rows, not grants. Also: a tmpfs full at start and one that
  fills up at run time (private mount namespaces; skipped without them); a read-only bind mount at
  start is test-restart.py's.
- A damaged lease line: the leases that can be read are restored, and nothing new is granted until an
  operator removes state.damaged, which keeps the line.
- lease-persistence = best-effort grants in memory-only mode, still with tokens that never go back.
- A wall clock stepped back a year: a restored detached lease keeps no more of its max-hold than it
  had left at the last instant persisted (the lease log's alive mark, written as the clock stood then).
- On a disk that fills up while brokerd runs, grants are refused (Unavailable) and the refusals are logged
  once per episode, not once per request.

Usage: test-persistence.py BROKERD SLOTCTL [unittest arguments]
"""
import glob
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import zlib

sys.dont_write_bytecode = True
import harness  # noqa: E402
from harness import MountNamespaceBroker, VarlinkError, group_alive, pid_alive, reap, wait_for  # noqa: E402
from witness import Witness  # noqa: E402

SLOTCTL = None

CONFIG = """\
[broker]
reclaim-grace = 2s

[pool p]
limit = 1

[lane w]
pools = p
policy = wait

[lane ff]
pools = p
policy = fail-fast
"""

DB_FILES = ("history.db", "history.db-wal", "history.db-shm")
LEASE_LOG = "leases.log"


def edit_lease_log(state_dir, edit):
    """Rewrites each record of the lease log as edit(record) returns it, each line with its CRC-32."""
    path = os.path.join(state_dir, LEASE_LOG)
    with open(path) as f:
        lines = f.read().splitlines()
    out = []
    for line in lines:
        crc, text = line.split(" ", 1)
        assert int(crc, 16) == zlib.crc32(text.encode()), line
        text = json.dumps(edit(json.loads(text)), separators=(",", ":"), ensure_ascii=False)
        out.append(f"{zlib.crc32(text.encode()):08x} {text}\n")
    with open(path, "w") as f:
        f.write("".join(out))


def lease_log_tokens(state_dir):
    """The tokens of the lease records in the lease log (its lines with a good CRC-32)."""
    tokens = set()
    with open(os.path.join(state_dir, LEASE_LOG), errors="replace") as f:
        for line in f.read().split("\n"):
            crc, _, text = line.partition(" ")
            if text and crc and all(c in "0123456789abcdef" for c in crc) and int(crc, 16) == zlib.crc32(text.encode()):
                lease = json.loads(text).get("lease")
                if isinstance(lease, dict) and "token" in lease:
                    tokens.add(lease["token"])
    return tokens


def chattr(flag, *paths):
    return subprocess.run(["chattr", flag, *paths], capture_output=True).returncode == 0


def proc_hides_processes():
    """True when /proc is mounted with hidepid= (other than 0): brokerd then keeps a group of zombies alive."""
    hides = True
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields, _, rest = line.partition(" - ")
            if fields.split()[4:5] == ["/proc"] and rest.split()[:1] == ["proc"]:
                opts = dict(o.partition("=")[::2] for o in rest.split()[2].split(","))
                hides = opts.get("hidepid", "0") not in ("0", "off")
    return hides


def group_members(pgid):
    """(pid, state) of each process of process group pgid, as /proc lists them."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            group = int(fields[2])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if group == pgid:
            yield int(entry), fields[0]


def group_runs(pgid):
    """True while a member of process group pgid has not exited (a zombie runs nothing)."""
    return any(state not in ("Z", "X") for _, state in group_members(pgid))


def group_sleeps(pgid):
    """The pids of process group pgid's members running sleep(1)."""
    out = []
    for pid, _ in group_members(pgid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if os.path.basename(f.read().split(b"\0", 1)[0]) == b"sleep":
                    out.append(pid)
        except OSError:
            continue  # gone meanwhile
    return out


class Witnessed(harness.BrokerTestCase):
    """Tests whose commands, run by slotctl, are witnessed (witness.py)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="persistence-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.witness = Witness(self.tmp)

    def run_slotctl(self, b, lane, argv, *options):
        """slotctl run, its command in a group of its own (slotctl's doing); returns slotctl's Popen."""
        p = subprocess.Popen([SLOTCTL, "run", "--socket", b.socket_path, "--lane", lane, *options, "--", *argv],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.addCleanup(lambda: (p.poll() is None and p.kill(), p.wait(), p.stderr.close()))
        return p

    def ff(self, b):
        """A fail-fast `slotctl run --lane ff` of a witnessed command that ends at once: its exit status."""
        p = self.run_slotctl(b, "ff", self.witness.command("true"))
        return p.wait(20)


class Persistence(Witnessed):

    def setUp(self):
        super().setUp()
        self.groups = []
        self.addCleanup(self.kill_groups)

    def kill_groups(self):
        for g in self.groups:
            try:
                os.killpg(g, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0)
        reap()

    def hold_with_slotctl(self, b, argv):
        """A `slotctl run --lane w` that got the slot and whose command started; then slotctl is SIGKILLed:
        the command alone holds the lease (SPEC §3.4). Returns (command pid, token)."""
        before = len(self.witness.started())
        p = self.run_slotctl(b, "w", argv)
        wait_for(lambda: len(self.witness.started()) > before, 10, message="the command to start")
        token = self.witness.started()[-1].token
        holder = [h for h in b.status()["holders"] if h["lease"]["token"] == token][0]
        pid = holder["lease"]["commandPid"]
        self.groups.append(pid)
        p.kill()
        p.wait()
        return pid, token

    def assert_refused(self, b, reason=None):
        with self.assertRaises(VarlinkError) as e:
            b.call("io.slotbroker.Acquire", {"lane": "ff"})
        if reason:
            self.assertEqual(e.exception.error, "io.slotbroker.Unavailable", e.exception.parameters)
            self.assertEqual(e.exception.parameters.get("reason"), reason)
        self.assertNotEqual(self.ff(b), 0, "the fail-fast job was granted a held slot")

    @staticmethod
    def term_group(pgid, done, message, timeout=30):
        """SIGTERM to process group pgid, then waits until done(). A SIGTERM that comes while a witnessed shell forks
        the sleep of its body (before the fork, or in the child before it dropped the shell's trap, whose handler
        then takes it) misses that sleep, which runs its 60 s (seen on a loaded CI machine, and under ASan with a
        CPU hog beside: the zombie-alone shape's group then had its leader and the witness's shell as zombies and
        a `sleep 60` running). The group's sleeps get SIGTERM again every second. Only they: a shell's trap runs
        once, and the helpers it forks to record its end are left be."""
        os.killpg(pgid, signal.SIGTERM)
        sent = time.monotonic()

        def again():
            nonlocal sent
            if time.monotonic() - sent >= 1.0:
                sent = time.monotonic()
                for pid in group_sleeps(pgid):
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass

        try:
            wait_for(lambda: again() or done(), timeout, message=message)
        except AssertionError:
            # Say what the group was doing (ps -g selects by session, not by process group: filter the table).
            ps = subprocess.run(["ps", "-e", "-o", "pid,ppid,pgid,stat,wchan:20,args"],
                                capture_output=True, text=True).stdout.splitlines()
            group = [line for line in ps[1:] if line.split()[2] == str(pgid)]
            raise AssertionError(f"process group {pgid}: no {message} {timeout} s after SIGTERM:\n" +
                                 "\n".join(ps[:1] + group))

    def end_group(self, pgid):
        """Ends the command of process group pgid, reaping what exits (the test is a subreaper) until the group
        has no member left."""
        self.term_group(pgid, lambda: reap() or not group_alive(pgid), "end of the command's group")

    def end_group_leaving_zombies(self, pgid):
        """Ends the command of process group pgid, its leader a zombie already, and reaps nothing: once no member
        runs, the group is one of zombies alone."""
        self.term_group(pgid, lambda: not group_runs(pgid), "end of every member")

    # ---- restart with every liveness shape of the held process tree ----

    def restart_shape(self, shape):
        if shape in ("zombie-alone", "zombies-while-down") and proc_hides_processes():
            self.skipTest("/proc is mounted with hidepid=: brokerd cannot tell a group of zombies alone")
        b = self.broker(CONFIG, f"persist-shape-{shape}")
        release = os.path.join(self.tmp, "release")
        pid, token = self.hold_with_slotctl(b, self.witness.group_command(release))
        if shape in ("leader-exited", "leader-zombie", "all-gone", "zombie-alone"):
            open(release, "w").close()
            # slotctl is dead: the leader's parent is now us (harness.main makes the test a subreaper).
            wait_for(lambda: not pid_alive(pid), 10, message="the leader to exit")
            if shape == "leader-exited":
                reap(pid)
        if shape in ("all-gone", "zombie-alone"):
            # Not only the witness's end record: a sleep of its body may run on after it (term_group()).
            self.end_group(pid) if shape == "all-gone" else self.end_group_leaving_zombies(pid)
            wait_for(lambda: self.witness.ended(), 10,
                     message="the member to record its end")
            if shape == "all-gone":
                reap(pid)
        # A zombie leader is still in its group (kill(-pgid, 0) finds it) but runs nothing, nor does a zombie
        # member: a group of zombies alone is gone, for the live brokerd as for a restarted one, whether or not
        # whoever inherited them ever reaps them (a container's PID 1 that reaps nothing).
        held = shape in ("leader-runs", "leader-exited", "leader-zombie")
        if held:
            # The running brokerd keeps it (SPEC §3.4)...
            self.assertNotEqual(self.ff(b), 0)
        elif shape == "zombie-alone":
            self.assertTrue(group_alive(pid), "the zombie leader keeps its group")
            try:
                wait_for(lambda: b.status()["pools"][0]["inUse"] == 0, 10, message="the slot of a group of zombies")
            except AssertionError as e:
                # All 'Z' here is brokerd's fault; anything else, the test's.
                raise AssertionError(f"{e}; the group's members (pid, state): {list(group_members(pid))}") from None
        b.crash()
        if shape == "zombies-while-down":
            # The group's last member ends while no brokerd runs; its leader stays a zombie.
            open(release, "w").close()
            wait_for(lambda: not pid_alive(pid), 10, message="the leader to exit")
            self.end_group_leaving_zombies(pid)
            self.assertTrue(group_alive(pid), "the zombie leader keeps its group")
        b.start()
        if shape == "zombies-while-down":
            # Not restored: nothing of its command runs.
            self.assertEqual(b.status()["pools"][0]["inUse"], 0)
        # ...and so must the restarted one.
        if held:
            self.assert_refused(b)
            holders = b.status()["holders"]
            self.assertEqual([h["lease"]["token"] for h in holders], [token], holders)
            self.end_group(pid)
            reap(pid)
        wait_for(lambda: b.status()["pools"][0]["inUse"] == 0, 10, message="the slot to free")
        self.assertEqual(self.ff(b), 0)
        self.witness.check(self)

    def test_restart_leader_runs(self):
        self.restart_shape("leader-runs")

    def test_restart_leader_exited_group_member_runs(self):
        self.restart_shape("leader-exited")

    def test_restart_leader_zombie_group_member_runs(self):
        self.restart_shape("leader-zombie")

    def test_restart_leader_zombie_group_gone(self):
        self.restart_shape("zombie-alone")

    def test_restart_a_group_become_zombies_while_no_brokerd_ran(self):
        self.restart_shape("zombies-while-down")

    def test_restart_all_gone(self):
        self.restart_shape("all-gone")

    def test_restart_command_in_its_parents_group_is_watched_by_its_leader(self):
        """A command attached by a client that did not give it a group of its own (it shares the client's):
        the live brokerd watches its leader alone, and so does a restarted one. Held while the leader runs;
        ended when it exits, although the client's group (this test) lives on."""
        b = self.broker(CONFIG, "persist-shared-group")
        child = subprocess.Popen(["sleep", "60"])  # our group, not a group of its own
        self.addCleanup(lambda: (child.poll() is None and child.kill(), child.wait()))
        a = b.acquire("w", pid=child.pid)
        a.until_granted()
        a.conn.close()  # only the command holds it now
        b.crash()
        b.start()
        holders = b.status()["holders"]
        self.assertEqual([h["lease"].get("commandPid") for h in holders], [child.pid], holders)
        self.assertNotEqual(self.ff(b), 0)
        child.kill()
        child.wait()
        wait_for(lambda: b.status()["pools"][0]["inUse"] == 0, 10, message="the slot to free")
        self.assertEqual(self.ff(b), 0)

    # ---- faults on each database file ----

    def can_chattr(self, directory):
        probe = os.path.join(directory, "chattr-probe")
        open(probe, "w").close()
        ok = chattr("+i", probe)
        if ok:
            chattr("-i", probe)
        os.unlink(probe)
        if not ok:
            self.skipTest("chattr +i does not work here (not root, or a file system without the immutable flag)")

    def immutable(self, b, names):
        paths = [os.path.join(b.state_dir, n) for n in names]
        for p in paths:
            if not os.path.exists(p):
                open(p, "w").close()  # as it is after a clean stop: made, then made immutable
        self.assertTrue(chattr("+i", *paths))
        self.addCleanup(chattr, "-i", *paths)
        return paths

    def fault_at_start(self, names, refuses=True):
        b = self.broker(CONFIG, "persist-start")
        self.can_chattr(b.state_dir)
        pid, token = self.hold_with_slotctl(b, self.witness.command())
        b.crash()
        paths = self.immutable(b, names)
        b.start()
        self.assertTrue(b.alive())
        # What the database holds is read (read-only), so the held slot stays held and Status is served...
        holders = b.status()["holders"]
        self.assertEqual([h["lease"]["token"] for h in holders], [token], holders)
        # ...and nothing is granted while leases cannot be written.
        self.assertEqual(b.status().get("unavailable"),
                         "leases cannot be written to the state directory" if refuses else None)
        self.assert_refused(b, "storage" if refuses else None)
        chattr("-i", *paths)
        # Writable again: grants resume (after the command ends), tokens above the old ones.
        self.end_group(pid)
        reap(pid)
        wait_for(lambda: b.status()["pools"][0]["inUse"] == 0, 10, message="the slot to free")
        wait_for(lambda: self.ff(b) == 0, 20, interval=0.5, message="a grant once the database is writable")
        self.assertEqual(b.log().count("Refusing new leases"), 1 if refuses else 0, b.log())
        self.witness.check(self)
        self.assertTrue(b.alive())

    def test_immutable_lease_log_at_start(self):
        self.fault_at_start([LEASE_LOG])

    def test_immutable_history_at_start(self):
        # Decision rows wait in memory; leases are the lease log's business.
        self.fault_at_start(DB_FILES, refuses=False)

    def test_immutable_all_at_start(self):
        self.fault_at_start((LEASE_LOG, *DB_FILES))

    def fault_at_run_time(self, names):
        b = self.broker(CONFIG, "persist-run")
        self.can_chattr(b.state_dir)
        pid, token = self.hold_with_slotctl(b, self.witness.command())
        paths = self.immutable(b, names)
        # Let the holder go and ask again: nothing may be granted that is not written.
        self.end_group(pid)
        reap(pid)
        wait_for(lambda: b.status()["pools"][0]["inUse"] == 0, 10, message="the slot to free")
        for _ in range(3):
            p = self.run_slotctl(b, "w", self.witness.command("sleep 60"))
            code = None
            try:
                code = p.wait(3)
            except subprocess.TimeoutExpired:
                pass
            if code is None:
                # Granted: then it must be in the database, which a crash shows.
                started = self.witness.started()
                self.assertGreater(len(started), 1)
                self.groups.append(b.status()["holders"][0]["lease"]["commandPid"])
                p.kill()
                p.wait()
                break
        self.assertTrue(b.alive(), "brokerd died")
        b.crash()
        chattr("-i", *paths)
        b.start()
        # Whatever was granted is held after the restart: the fail-fast job must not get the slot while a
        # granted command runs.
        if len(self.witness.started()) > 1:
            self.assertNotEqual(self.ff(b), 0, "a lease granted before the crash was lost")
        self.witness.check(self)

    def test_immutable_lease_log_at_run_time(self):
        self.fault_at_run_time([LEASE_LOG])

    def test_immutable_history_at_run_time(self):
        self.fault_at_run_time(DB_FILES)

    def test_immutable_all_at_run_time(self):
        self.fault_at_run_time((LEASE_LOG, *DB_FILES))

    def test_unreadable_lease_log_grants_nothing_until_it_is_read(self):
        """A lease log that is not one, in a directory where it cannot be moved aside (made immutable):
        nothing can be read, so nothing is granted (Unavailable, reason storage) and Status is served; once
        the directory is writable again the file is moved aside, tokens continue above the realtime clock,
        and grants resume, with tokens above every one issued before."""
        b = self.broker(CONFIG, "persist-unreadable")
        self.can_chattr(b.state_dir)
        self.assertEqual(self.ff(b), 0)
        b.stop()
        with open(os.path.join(b.state_dir, LEASE_LOG), "wb") as f:
            f.write(os.urandom(64 * 1024))
        self.assertTrue(chattr("+i", b.state_dir))
        self.addCleanup(chattr, "-i", b.state_dir)
        b.start()
        status = b.status()  # Status is served, and says why nothing is granted
        self.assertEqual(status["pools"][0]["inUse"], 0)
        self.assertEqual(status.get("unavailable"), "the state directory cannot be read")
        text = subprocess.run([SLOTCTL, "status", "--socket", b.socket_path], capture_output=True, text=True)
        self.assertIn("No lease is granted now: the state directory cannot be read", text.stdout, text.stderr)
        with self.assertRaises(VarlinkError) as e:
            b.call("io.slotbroker.Acquire", {"lane": "ff"})
        self.assertEqual(e.exception.error, "io.slotbroker.Unavailable")
        self.assertEqual(e.exception.parameters["reason"], "storage")
        self.assertNotEqual(self.ff(b), 0, "granted while what was persisted cannot be read")
        self.assertIn("Cannot read the leases", b.log())
        chattr("-i", b.state_dir)
        wait_for(lambda: "is not a lease log: moved aside" in b.log(), 30, interval=0.5,
                 message="the lease log moved aside once the directory is writable")
        self.assertEqual(len(glob.glob(os.path.join(b.state_dir, LEASE_LOG + ".corrupt-*"))), 1)
        # Which leases it held is not known: nothing is granted until an operator removes state.damaged.
        self.assert_refused(b, "storage")
        with open(os.path.join(b.state_dir, "state.damaged")) as f:
            self.assertIn("is not a lease log", f.read())
        os.unlink(os.path.join(b.state_dir, "state.damaged"))
        wait_for(lambda: self.ff(b) == 0, 10, interval=0.2, message="grants once state.damaged is removed")
        self.witness.check(self)

    def test_a_damaged_lease_line_holds_grants_back_until_its_file_is_removed(self):
        """SPEC §3.4: a lease line that does not check out held a slot that nobody can name now. brokerd restores
        the leases it can read, keeps the line in state.damaged, and grants nothing new while that file exists,
        across a restart too (the log is rewritten without the line); its removal is the operator's word, taken
        without a restart. Before, the slot the line held was granted again at once."""
        b = self.broker(CONFIG.replace("limit = 1", "limit = 2"), "persist-damaged")
        kept = b.call("io.slotbroker.Acquire", {"lane": "w", "detach": True, "maxHoldMs": 3600000})["lease"]
        lost = b.call("io.slotbroker.Acquire", {"lane": "w", "detach": True, "maxHoldMs": 3600000})["lease"]
        b.stop()
        harness.damage_lease_line(b.state_dir, lost["id"])

        b.start()
        status = b.status()
        self.assertEqual([h["lease"]["token"] for h in status["holders"]], [kept["token"]], status)
        self.assertIn("state.damaged", status.get("unavailable", ""))
        self.assert_refused(b, "storage")
        damage = os.path.join(b.state_dir, "state.damaged")
        with open(damage) as f:
            self.assertIn(lost["id"][::-1], f.read())
        self.assertIn("1 damaged line(s) skipped", b.log())
        # The lease it could read goes on, and ends as ever; the slot it frees is not granted either.
        b.call("io.slotbroker.Release", {"lease": kept["id"]})
        self.assertEqual(b.status()["holders"], [])
        self.assert_refused(b, "storage")
        # A restart reads a log without the line: the file alone holds grants back.
        b.stop()
        b.start()
        self.assertNotIn("damaged line", b.log().split("Listening")[-1])
        self.assert_refused(b, "storage")

        os.unlink(damage)
        wait_for(lambda: self.ff(b) == 0, 10, interval=0.2, message="grants once state.damaged is removed")
        self.assertIn("state.damaged was removed: granting again", b.log())
        token = b.call("io.slotbroker.Acquire", {"lane": "ff"})["lease"]["token"]
        self.assertGreater(token, lost["token"], "a token the damaged line may have held is issued again")
        self.witness.check(self)

    def test_a_second_brokerd_on_the_state_directory_is_refused_before_it_reads_it(self):
        """Started by hand beside the running one (same command line): it read and rewrote the lease log by
        rename before it failed to bind, so the running one appended to a file nobody would read, and after
        its next restart granted a held slot and its token again. It now stops at the state directory's
        lock, naming the brokerd that holds it, and touches nothing."""
        b = self.broker(CONFIG, "persist-second")
        first = b.call("io.slotbroker.Acquire", {"lane": "w", "detach": True, "maxHoldMs": 3600000})["lease"]
        before = os.stat(os.path.join(b.state_dir, LEASE_LOG))
        second = subprocess.run(b.argv(), capture_output=True, text=True, timeout=20)
        self.assertNotEqual(second.returncode, 0, "a second brokerd on one state directory must not start")
        self.assertIn(f"in use by another brokerd (pid {b.proc.pid})", second.stderr)
        after = os.stat(os.path.join(b.state_dir, LEASE_LOG))
        self.assertEqual((before.st_ino, before.st_size), (after.st_ino, after.st_size), "the lease log was touched")
        self.assertTrue(b.responsive(), "the running brokerd serves on")
        b.stop()
        b.start()
        holders = b.status()["holders"]
        self.assertEqual([h["lease"]["token"] for h in holders], [first["token"]], "the detached lease is restored")
        self.assertNotEqual(self.ff(b), 0, "its slot is not granted again")

    # ---- best-effort ----

    def test_best_effort_grants_in_memory_and_tokens_never_go_back(self):
        config = CONFIG.replace("[broker]\n", "[broker]\nlease-persistence = best-effort\n")
        b = self.broker(config, "persist-best-effort")
        self.can_chattr(b.state_dir)
        self.assertEqual(self.ff(b), 0)
        b.crash()
        self.immutable(b, (LEASE_LOG, *DB_FILES))
        b.start()
        self.assertEqual(self.ff(b), 0, "best-effort refused a grant")
        self.assertEqual(self.ff(b), 0)
        self.assertIn("not persisted", b.log())
        b.crash()
        b.start()
        self.assertEqual(self.ff(b), 0)
        self.witness.check(self)

    def test_best_effort_lease_granted_in_memory_is_written_once_the_log_can_be(self):
        """A lease best-effort granted while its row could not be written is in the lease log that brokerd
        mends once it can write again (every 5 s), so a crash after that keeps it. It was left out of every
        snapshot after its failed row: the restarted brokerd forgot a lease whose command still ran."""
        config = CONFIG.replace("[broker]\n", "[broker]\nlease-persistence = best-effort\n")
        b = self.broker(config, "persist-best-effort-mend")
        lift = self.limit_file_size(b)
        pid, token = self.hold_with_slotctl(b, self.witness.command())
        self.assertNotIn(token, lease_log_tokens(b.state_dir), "the row was written: nothing to mend")
        lift()
        wait_for(lambda: token in lease_log_tokens(b.state_dir), 30, message="the lease log mended with the lease")
        b.crash()
        b.start()
        holders = b.status()["holders"]
        self.assertEqual([h["lease"]["token"] for h in holders], [token], holders)
        self.assert_refused(b)
        self.end_group(pid)
        reap(pid)
        wait_for(lambda: b.status()["pools"][0]["inUse"] == 0, 10, message="the slot to free")
        self.witness.check(self)

    # ---- a file-size limit (LimitFSIZE=) reached at run time ----

    def limit_file_size(self, b):
        """No write of brokerd's to a file succeeds from now on (its RLIMIT_FSIZE at 0: EFBIG, as a LimitFSIZE=
        reached; its log lines to the harness's file are lost meanwhile) until the returned function lifts it."""
        old = resource.prlimit(b.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(b.pid, resource.RLIMIT_FSIZE, (0, old[1]))

        def lift():
            if b.alive():
                resource.prlimit(b.pid, resource.RLIMIT_FSIZE, old)
        self.addCleanup(lift)
        return lift

    def test_file_size_limit_at_run_time_refuses_and_brokerd_lives(self):
        """A file-size limit reached fails brokerd's writes with EFBIG, as a full disk does: a new lease is
        refused "storage" and brokerd stays up (the limit's SIGXFSZ, by default fatal, is ignored); grants
        resume once the limit is lifted."""
        b = self.broker(CONFIG, "persist-fsize")
        self.assertEqual(self.ff(b), 0)
        lift = self.limit_file_size(b)
        self.assert_refused(b, "storage")
        self.assertTrue(b.alive(), "brokerd died at the file-size limit")
        lift()
        wait_for(lambda: self.ff(b) == 0, 30, interval=0.5, message="grants once the limit is lifted")
        self.assertTrue(b.alive())

    # ---- the wall clock stepped back ----

    def test_clock_stepped_back_does_not_stretch_a_restored_max_hold(self):
        b = self.broker(CONFIG, "persist-clock")
        out = subprocess.run([SLOTCTL, "acquire", "--socket", b.socket_path, "--lane", "w", "--detach",
                              "--max-hold", "3s"], capture_output=True, text=True, timeout=10)
        self.assertEqual(out.returncode, 0, out.stderr)
        b.crash()
        # As if the clock now stood a year before the grant: move every persisted instant a year ahead.
        year = 365 * 24 * 3600 * 10**6

        def ahead(record):
            if "lease" in record:
                record["lease"]["grantedAt"] += year
                record["lease"]["expiresAt"] += year
            return record
        edit_lease_log(b.state_dir, ahead)  # no alive mark moves with them: what this test is about
        b.start()
        self.assertEqual(len(b.status()["holders"]), 1)
        t0 = time.monotonic()
        wait_for(lambda: b.status()["pools"][0]["inUse"] == 0, 15, message="the restored lease to expire")
        self.assertLess(time.monotonic() - t0, 10)


    def test_clock_stepped_back_bounds_a_long_hold_by_the_alive_mark(self):
        """A lease granted 50 min before the crash with max-hold 1h had 10 min left when brokerd last ran (the
        alive mark); with the clock now a year behind, it keeps those 10 min, not a year and 10 min."""
        b = self.broker(CONFIG, "persist-alive")
        out = subprocess.run([SLOTCTL, "acquire", "--socket", b.socket_path, "--lane", "w", "--detach",
                              "--max-hold", "1h"], capture_output=True, text=True, timeout=10)
        self.assertEqual(out.returncode, 0, out.stderr)
        b.crash()
        year, minute = 365 * 24 * 3600 * 10**6, 60 * 10**6
        alive = []
        edit_lease_log(b.state_dir, lambda r: (alive.append(r["alive"]) if "alive" in r else None, r)[1])
        alive = max(alive)

        # Granted 50 min before the alive mark; then everything a year ahead of the clock.
        def moved(record):
            if "lease" in record:
                record["lease"]["grantedAt"] = alive - 50 * minute + year
                record["lease"]["expiresAt"] = alive - 50 * minute + 60 * minute + year
            if "alive" in record:
                record["alive"] += year
            return record
        edit_lease_log(b.state_dir, moved)
        b.start()
        holders = b.status()["holders"]
        self.assertEqual(len(holders), 1, holders)
        left = holders[0]["lease"]["expiresAt"] - time.time() * 10**6
        self.assertLessEqual(left, 11 * minute, f"{left / minute:.0f} min left")
        self.assertGreater(left, 9 * minute, f"{left / minute:.0f} min left")


class FullDisk(harness.BrokerTestCase):
    """The state directory on a small tmpfs that fills up while brokerd runs."""

    def test_full_disk_refuses_and_logs_once_per_episode(self):
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                "mount -t tmpfs -o size=1m none /mnt"], capture_output=True)
        if probe.returncode != 0:
            self.skipTest(f"no private mount namespace with a tmpfs here: {probe.stderr.decode().strip()}")

        b = MountNamespaceBroker(CONFIG, 'mount -t tmpfs -o size=4m none "$1"', name="persist-full")
        os.makedirs(b.state_dir, exist_ok=True)
        b.start()
        self.addCleanup(self.stop_broker, b, True)
        a = b.acquire("w")
        a.until_granted()
        a.close()
        # Fill what is left but the lease log's reserve (fallocate()d past its end: lease lines get it).
        fd = os.open(f"/proc/{b.pid}/root{b.state_dir}/filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"x" * 4096) > 0:
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        answers = {}
        job = "j" * 1000  # larger rows: the database needs more room per request
        for _ in range(1500):
            try:
                with b.connect() as c:
                    c.call("io.slotbroker.Acquire", {"lane": "ff", "job": job})
                answers["granted"] = answers.get("granted", 0) + 1
            except VarlinkError as e:
                self.assertEqual(e.error, "io.slotbroker.Unavailable", e.parameters)
                answers[e.error] = answers.get(e.error, 0) + 1
            if answers.get("io.slotbroker.Unavailable", 0) >= 20:
                break
        self.assertGreaterEqual(answers.get("io.slotbroker.Unavailable", 0), 20, answers)
        log = b.log()
        # Once per episode: a write that fits meanwhile (the history's checkpoint gave room back, under load)
        # ends one, and the next refusal begins another, told again.
        self.assertGreaterEqual(log.count("Refusing new leases"), 1, log[-3000:])
        self.assertLessEqual(log.count("Refusing new leases"), log.count("Leases are persisted again") + 1, log[-3000:])
        self.assertNotIn("Could not persist lease", log)
        self.assertTrue(b.alive())


class MountFaults(Witnessed):
    """The state directory full (a tmpfs) in a mount namespace of brokerd's own, at start (at run time:
    FullDisk; a read-only bind mount at start: test-restart.py). A read-only remount while brokerd runs
    cannot be made: the kernel refuses it (EBUSY) while history.db is open for writing."""

    def setUp(self):
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                "mount -t tmpfs -o size=1m none /mnt && mount --bind /mnt /mnt && "
                                "mount -o remount,bind,ro /mnt"], capture_output=True)
        if probe.returncode != 0:
            self.skipTest(f"no private mount namespace here: {probe.stderr.decode().strip()}")
        super().setUp()

    def broker_in_namespace(self, name, setup):
        """brokerd in a mount namespace of its own where `setup` ran first; its state directory is made."""
        b = MountNamespaceBroker(CONFIG, setup, name=name)
        os.makedirs(b.state_dir, exist_ok=True)
        return b

    def hold(self, b):
        p = self.run_slotctl(b, "w", self.witness.command())
        wait_for(lambda: self.witness.started(), 10, message="the command to start")
        return p

    def test_full_tmpfs_at_start(self):
        # A first run leaves history.db with a lease whose command runs; the second starts on a copy of it
        # in a tmpfs with no room left.
        first = self.broker_in_namespace("persist-full-1", "true")
        first.start()
        self.addCleanup(first.stop)
        holder = self.hold(first)
        token = self.witness.started()[-1].token
        first.crash()
        b = self.broker_in_namespace(
            "persist-full-2",
            f'mount -t tmpfs -o size=4m none "$1" && cp -a {first.state_dir}/. "$1"/ && '
            '{ dd if=/dev/zero of="$1"/filler bs=4k 2>/dev/null; true; }')
        b.start()
        self.addCleanup(self.stop_broker, b, True)
        holders = b.status()["holders"]
        self.assertEqual([h["lease"]["token"] for h in holders], [token], holders)
        self.assertNotEqual(self.ff(b), 0, "granted the slot of a restored lease")
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        # slotctl is gone and its command too (slotctl's death signal): the slot frees; whatever is
        # granted on the full disk must have been written.
        self.witness.check(self)
        self.assertTrue(b.alive())


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
