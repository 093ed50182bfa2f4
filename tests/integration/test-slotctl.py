#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""slotctl against the real brokerd: run (environment, exit codes, refusals, signals, --timeout, process
groups, SIGKILL of slotctl), acquire --detach/release, status, drain/undrain, cancel, reload — SPEC §6's
exit-code table end to end. Each test starts its own brokerd on a private socket and config and kills it
by pid at the end.

Usage: test-slotctl.py SLOTCTL BROKERD
"""
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import unittest

SLOTCTL = None
BROKERD = None

CONFIG = """\
[pool grid]
limit = 1
queue-timeout = 5m

[pool rigs]
members = rig-a rig-b rig-c

[lane merge]
pools = grid
policy = fail-fast

[lane nightly]
pools = grid
policy = wait
queue-timeout = infinity

[lane rig]
pools = rigs
policy = wait

[lane short]
pools = grid
policy = fail-fast
max-hold = 1s

[lane locked]
pools = grid
allow-users = root
"""

# Variables of the environment that would change what slotctl does: the tests set them explicitly.
SCRUBBED = ("CI_JOB_URL", "GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID", "GITHUB_JOB",
            "BUILDKITE_BUILD_URL", "BUILD_URL", "SLOTBROKER_SOCKET", "SLOTBROKER_LANE", "SLOT_LEASE", "SLOT_TOKEN",
            "SLOT_POOL", "SLOT_INDEX", "SLOT_MEMBER", "SLOT_LANE")


def wait_for(condition, timeout=10.0, what="condition"):
    """Polls condition() with short sleeps until it is true; fails after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Broker:
    """brokerd on a private socket, config and state directory."""

    def __init__(self, config=CONFIG, env=None):
        self.dir = tempfile.mkdtemp(prefix="test-slotctl-")
        os.chmod(self.dir, 0o755)  # the permission tests run slotctl as nobody
        self.socket = os.path.join(self.dir, "sock")
        self.config = os.path.join(self.dir, "brokerd.conf")
        self.write_config(config)
        self.log = open(os.path.join(self.dir, "brokerd.log"), "w")
        self.env = dict(os.environ, **(env or {}))
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            [BROKERD, "--config", self.config, "--socket", self.socket,
             "--state-directory", os.path.join(self.dir, "state")],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        wait_for(self.connectable, 10, "brokerd to accept connections")

    def kill_and_restart(self):
        """SIGKILL, then a new brokerd on the same socket and state (it restores the leases); same log."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        os.unlink(self.socket)
        self.start()

    def write_config(self, text):
        with open(self.config, "w") as f:
            f.write(text)

    def connectable(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"brokerd exited with {self.proc.returncode}: {self.read_log()}")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def read_log(self):
        with open(os.path.join(self.dir, "brokerd.log")) as f:
            return f.read()

    def call(self, method, parameters=None):
        """One Varlink call with our own framing, independent of slotctl."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(self.socket)
            s.sendall(json.dumps({"method": method, "parameters": parameters or {}}).encode() + b"\0")
            data = b""
            while not data.endswith(b"\0"):
                chunk = s.recv(65536)
                if not chunk:
                    raise AssertionError("brokerd closed the connection")
                data += chunk
        reply = json.loads(data[:-1])
        if "error" in reply:
            raise AssertionError(f"{method}: {reply}")
        return reply.get("parameters", {})

    def status(self):
        return self.call("io.slotbroker.Status")

    def holders(self):
        return self.status()["holders"]

    def waiters(self):
        return self.status()["waiters"]

    def wait_idle(self):
        """The broker frees a slot a little after its command's group is gone: wait for that."""
        wait_for(lambda: not self.holders() and not self.waiters(), 10, "the broker to be idle")

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class SlotctlTest(unittest.TestCase):
    config = CONFIG

    def setUp(self):
        self.broker = Broker(self.config)
        self.children = []

    def tearDown(self):
        for p in self.children:
            if p.poll() is None:
                p.kill()
                p.wait()
            for f in (p.stdout, p.stderr):
                if f:
                    f.close()
        self.broker.stop()

    def env(self, **extra):
        env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
        env["SLOTBROKER_SOCKET"] = self.broker.socket
        env.update(extra)
        return env

    def run_slotctl(self, *args, env=None, timeout=30, **kw):
        return subprocess.run([SLOTCTL, *args], env=env or self.env(), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, **kw)

    def start_slotctl(self, *args, env=None, **kw):
        p = subprocess.Popen([SLOTCTL, *args], env=env or self.env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, **kw)
        self.children.append(p)
        return p

    def path(self, name):
        return os.path.join(self.broker.dir, name)

    def hold_until(self, stop_file, lane="merge", *extra):
        """A slotctl run whose command holds its slot until stop_file exists. Returns the Popen once the
        command runs (not merely granted: until its exec, the command still dies with slotctl)."""
        started = stop_file + ".started"
        p = self.start_slotctl("run", "--lane", lane, *extra, "--", "sh", "-c",
                               f'touch "{started}"; while [ ! -e "{stop_file}" ]; do sleep 0.05; done')
        wait_for(lambda: os.path.exists(started), 10, "the command to start")
        wait_for(lambda: any(h["lease"].get("commandPid") for h in self.broker.holders()), 10, "the slot to be held")
        return p


class RunEnvironment(SlotctlTest):
    def test_command_gets_the_lease_in_its_environment(self):
        r = self.run_slotctl("run", "--lane", "merge", "--", "env", env=self.env(SLOT_MEMBER="stale-from-parent"))
        self.assertEqual(r.returncode, 0, r.stderr)
        env = dict(line.split("=", 1) for line in r.stdout.splitlines() if line.startswith("SLOT_"))
        self.assertRegex(env["SLOT_LEASE"], r"^[0-9a-f]{32}$")
        self.assertRegex(env["SLOT_TOKEN"], r"^[1-9][0-9]*$")
        self.assertEqual(env["SLOT_POOL"], "grid")
        self.assertEqual(env["SLOT_INDEX"], "0")
        self.assertEqual(env["SLOT_LANE"], "merge")
        # Not a pool of members: a SLOT_MEMBER inherited from an outer run must not leak in.
        self.assertNotIn("SLOT_MEMBER", env)
        self.assertEqual(r.stderr, "")

    def test_member_pool_lists_members_and_indices(self):
        r = self.run_slotctl("run", "--lane", "rig", "--slots", "2", "--", "env")
        self.assertEqual(r.returncode, 0, r.stderr)
        env = dict(line.split("=", 1) for line in r.stdout.splitlines() if line.startswith("SLOT_"))
        self.assertEqual(env["SLOT_POOL"], "rigs")
        indices = [int(i) for i in env["SLOT_INDEX"].split(",")]
        members = env["SLOT_MEMBER"].split(",")
        self.assertEqual(len(indices), 2)
        self.assertEqual(members, [["rig-a", "rig-b", "rig-c"][i] for i in indices])

    def test_lane_defaults_from_environment_and_is_required(self):
        r = self.run_slotctl("run", "--", "true", env=self.env(SLOTBROKER_LANE="merge"))
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.run_slotctl("run", "--", "true")
        self.assertEqual(r.returncode, 64)
        self.assertIn("no lane given", r.stderr)

    def test_command_runs_without_a_shell(self):
        r = self.run_slotctl("run", "--lane", "nightly", "--", "echo", "$HOME", "a b")
        self.assertEqual(r.stdout, "$HOME a b\n")
        r = self.run_slotctl("run", "--lane", "nightly", "--", "/nonexistent/command")
        self.assertEqual(r.returncode, 127)
        self.assertIn("failed to execute", r.stderr)


    def test_command_holds_no_descriptor_of_slotctl(self):
        # Its connection to the broker above all: a command holding it would keep the lease's life line.
        code = ("import os\nfds = []\nfor fd in range(1024):\n    try:\n        os.fstat(fd)\n"
                "    except OSError:\n        continue\n    fds.append(fd)\nprint(fds)")
        r = self.run_slotctl("run", "--lane", "merge", "--", sys.executable, "-c", code)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "[0, 1, 2]\n")

    def test_a_command_found_nowhere_exits_127_without_waiting(self):
        # A mistyped command fails before it queues, not after a wait for a slot it would waste.
        stop = self.path("stop")
        holder = self.hold_until(stop)
        env = self.env(PATH=f"{self.broker.dir}:/nonexistent:/usr/bin:/bin")
        for command in ("no-such-command-here", "/nonexistent/command", "./no-such-command-here", ""):
            r = self.run_slotctl("run", "--lane", "nightly", "--", command, env=env, timeout=10)
            self.assertEqual(r.returncode, 127, f"{command!r}: {r.stderr}")
            self.assertIn("failed to execute", r.stderr)
        self.assertEqual(self.broker.waiters(), [])
        open(stop, "w").close()
        self.assertEqual(holder.wait(10), 0)

class ExitCodes(SlotctlTest):
    def test_command_status_passes_through(self):
        for script, code in (("exit 0", 0), ("exit 3", 3), ("kill -KILL $$", 128 + 9), ("kill -TERM $$", 128 + 15)):
            r = self.run_slotctl("run", "--lane", "nightly", "--", "sh", "-c", script)
            self.assertEqual(r.returncode, code, f"{script}: {r.stderr}")

    def test_a_gone_reader_of_stderr_does_not_replace_the_status(self):
        # slotctl writes its waiting line to a pipe nobody reads any more (a CI log collector gone, | head):
        # the write fails, and the SIGPIPE it raised must not end slotctl on its way out, after the command
        # it ran, in place of that command's status.
        stop = self.path("stop")
        holder = self.hold_until(stop)
        r, w = os.pipe()
        os.close(r)
        try:
            p = subprocess.Popen([SLOTCTL, "run", "--lane", "nightly", "--", "sh", "-c", "exit 3"], env=self.env(),
                                 stdin=subprocess.DEVNULL, stderr=w)
        finally:
            os.close(w)
        self.children.append(p)
        wait_for(lambda: len(self.broker.waiters()) == 1, 10, "the waiter to queue")
        open(stop, "w").close()
        self.assertEqual(holder.wait(10), 0)
        self.assertEqual(p.wait(10), 3)

    def test_busy_exits_75_with_the_retry_hint(self):
        stop = self.path("stop")
        holder = self.hold_until(stop)
        r = self.run_slotctl("run", "--lane", "merge", "--", "touch", self.path("ran"))
        self.assertEqual(r.returncode, 75)
        self.assertRegex(r.stderr, r"slotctl: refused \(busy\): pool grid is full; retry after \d+ s")
        self.assertFalse(os.path.exists(self.path("ran")), "a refused command must never run")
        r = self.run_slotctl("run", "--lane", "merge", "--conflict-exit-code", "42", "--", "true")
        self.assertEqual(r.returncode, 42)
        r = self.run_slotctl("run", "--lane", "nightly", "--no-wait", "--", "true")
        self.assertEqual(r.returncode, 75)
        open(stop, "w").close()
        self.assertEqual(holder.wait(10), 0)

    def test_max_wait_times_out_with_75(self):
        stop = self.path("stop")
        holder = self.hold_until(stop)
        start = time.monotonic()
        r = self.run_slotctl("run", "--lane", "nightly", "--max-wait", "300ms", "--", "true")
        self.assertEqual(r.returncode, 75)
        self.assertIn("refused (timeout)", r.stderr)
        self.assertLess(time.monotonic() - start, 5)
        open(stop, "w").close()
        holder.wait(10)

    def test_broker_absent_exits_69_unless_told_to_run(self):
        missing = self.path("no-such-socket")
        r = self.run_slotctl("run", "--socket", missing, "--lane", "merge", "--", "touch", self.path("ran"))
        self.assertEqual(r.returncode, 69)
        self.assertIn("cannot reach the broker", r.stderr)
        self.assertFalse(os.path.exists(self.path("ran")))

        r = self.run_slotctl("run", "--socket", missing, "--if-unavailable", "run", "--lane", "merge", "--",
                             "sh", "-c", 'echo "lease=${SLOT_LEASE-unset}"; exit 5',
                             env=self.env(SLOT_LEASE="from-an-outer-run"))
        self.assertEqual(r.returncode, 5)
        self.assertEqual(r.stdout, "lease=unset\n")
        self.assertIn("without a slot", r.stderr)

    def fake_broker(self, answers):
        """A socket that reads one call per connection and, per connection in turn, closes it (None) or
        answers the given reply. Returns the list of methods it read, filled as it goes."""
        path = self.path("fake.socket")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        srv.bind(path)
        srv.listen(8)
        srv.settimeout(20)
        seen = []

        def serve():
            try:
                for answer in answers:
                    c, _ = srv.accept()
                    with c:
                        data = b""
                        while not data.endswith(b"\0"):
                            chunk = c.recv(65536)
                            if not chunk:
                                break
                            data += chunk
                        seen.append(json.loads(data[:-1])["method"] if data.endswith(b"\0") else None)
                        if answer is not None:
                            c.sendall(json.dumps(answer).encode() + b"\0")
            except OSError:
                pass
            finally:
                srv.close()
        t = threading.Thread(target=serve, daemon=True)
        t.start()
        self.addCleanup(t.join, 30)
        return path, seen

    def test_a_read_is_asked_again_when_the_connection_closes_before_its_reply(self):
        # brokerd restarting closes a connection whose Status or History reply is on its way (brokerd(8)):
        # slotctl asks again. A change is never asked twice: it may have been applied.
        path, seen = self.fake_broker([None, None, {"parameters": {"text": "slotbroker_up 1\n"}}])
        r = self.run_slotctl("metrics", "--socket", path)
        self.assertEqual((r.returncode, r.stdout), (0, "slotbroker_up 1\n"), r.stderr)
        self.assertEqual(seen, ["io.slotbroker.Metrics"] * 3)
        os.unlink(path)
        path, seen = self.fake_broker([None, {"parameters": {"cancelled": 0}}])
        r = self.run_slotctl("cancel", "--socket", path, "--all")
        self.assertEqual(r.returncode, 69, r.stderr)
        self.assertIn("closed the connection", r.stderr)
        self.assertEqual(seen, ["io.slotbroker.Cancel"])

    def test_usage_errors_exit_64(self):
        for args in (["run", "--lane", "merge"],                       # no command
                     ["run", "--bogus", "--", "true"],
                     ["run", "--lane", "merge", "--slots", "0", "--", "true"],
                     ["run", "--lane", "merge", "--timeout", "soon", "--", "true"],
                     ["run", "--lane", "merge", "--if-unavailable", "maybe", "--", "true"],
                     ["run", "--lane", "merge", "--max-wait", "0", "--", "true"],
                     ["status", "extra"],
                     ["release"],
                     ["acquire", "--detach", "--lane", "merge"]):       # no --max-hold
            r = self.run_slotctl(*args)
            self.assertEqual(r.returncode, 64, f"{args}: {r.stderr}")
            self.assertRegex(r.stderr, r"^slotctl[ :]")

    def test_an_empty_lane_is_named_as_the_error(self):
        # --lane "$LANE" with $LANE unset, the usual way to get one: the message must point at --lane.
        for args in (["run", "--lane", "", "--", "true"], ["acquire", "--detach", "--max-hold", "1m", "--lane", ""]):
            r = self.run_slotctl(*args)
            self.assertEqual(r.returncode, 64, r.stderr)
            self.assertIn("--lane: empty", r.stderr)

    def test_unknown_lane_and_impossible_request_exit_64(self):
        r = self.run_slotctl("run", "--lane", "nope", "--", "true")
        self.assertEqual(r.returncode, 64)
        self.assertIn('no lane "nope"', r.stderr)
        r = self.run_slotctl("run", "--lane", "merge", "--slots", "2", "--", "true")
        self.assertEqual(r.returncode, 64)
        self.assertIn('parameter "slots"', r.stderr)

    def test_permission_denied_exits_77(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to run slotctl as another user")
        if not os.access(SLOTCTL, os.X_OK) or any(
                not os.stat(d).st_mode & 0o001 for d in parents(os.path.dirname(os.path.realpath(SLOTCTL)))):
            self.skipTest("slotctl is not reachable by nobody")

        def as_nobody():
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)

        # The lane's ACL admits root only.
        r = self.run_slotctl("run", "--lane", "locked", "--", "true", preexec_fn=as_nobody)
        self.assertEqual(r.returncode, 77, r.stderr)
        self.assertIn("permission denied by lane locked", r.stderr)
        # The socket itself.
        os.chmod(self.broker.socket, 0o600)
        r = self.run_slotctl("run", "--lane", "merge", "--", "true", preexec_fn=as_nobody)
        self.assertEqual(r.returncode, 77, r.stderr)
        r = self.run_slotctl("status", preexec_fn=as_nobody)
        self.assertEqual(r.returncode, 77, r.stderr)
        os.chmod(self.broker.socket, 0o666)
        # Another user's lease: its owner's, not the lane's ACL, is the reason.
        lease = self.run_slotctl("acquire", "--detach", "--max-hold", "1h", "--lane", "merge").stdout.strip()
        r = self.run_slotctl("release", lease, preexec_fn=as_nobody)
        self.assertEqual(r.returncode, 77, r.stderr)
        self.assertIn(f"permission denied: lease {lease} belongs to another user", r.stderr)
        self.assertNotIn("lane", r.stderr)
        self.assertEqual([h["lease"]["id"] for h in self.broker.holders()], [lease])


def process_state(pid):
    """The state letter of /proc/PID/stat ("T": stopped), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return f.read().split()


def read_int(path):
    with open(path) as f:
        return int(f.read())


def parents(path):
    while True:
        yield path
        if path == "/":
            return
        path = os.path.dirname(path)


class Signals(SlotctlTest):
    def test_sigint_while_waiting_withdraws_and_exits_130(self):
        stop = self.path("stop")
        holder = self.hold_until(stop)
        for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
            waiter = self.start_slotctl("run", "--lane", "nightly", "--", "touch", self.path("ran"))
            wait_for(lambda: len(self.broker.waiters()) == 1, 10, "the waiter to queue")
            waiter.send_signal(sig)
            self.assertEqual(waiter.wait(10), code)
            wait_for(lambda: not self.broker.waiters(), 5, "the waiter to be withdrawn")
        # The blocked command was never let go, and the holder is undisturbed.
        self.assertFalse(os.path.exists(self.path("ran")))
        self.assertEqual(len(self.broker.holders()), 1)
        open(stop, "w").close()
        self.assertEqual(holder.wait(10), 0)

    def test_signals_are_forwarded_to_the_running_command(self):
        p = self.start_slotctl("run", "--lane", "merge", "--", "sh", "-c",
                               f'trap "exit 7" TERM; touch "{self.path("ready")}"; while :; do sleep 0.05; done')
        wait_for(lambda: os.path.exists(self.path("ready")), 10, "the command to start")
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(10), 7)

    def test_a_forwarded_signal_reaches_a_stopped_command(self):
        # A command stopped (SIGSTOP, or SIGTTIN: it read from the terminal it is in the background of) acts
        # on no signal but SIGKILL until continued: slotctl's SIGTERM must still end it.
        p = self.start_slotctl("run", "--lane", "merge", "--", "sh", "-c", "kill -STOP $$; exit 5")
        command = wait_for(lambda: [h["lease"].get("commandPid") for h in self.broker.holders()
                                    if h["lease"].get("commandPid")], 10, "the command to run")[0]
        wait_for(lambda: process_state(command) == "T", 10, "the command to stop itself")
        p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(10), 143)
        self.broker.wait_idle()

    def test_a_command_stopped_by_the_terminal_is_reported(self):
        # It runs in the background of slotctl's terminal: a read from it stops the command (SIGTTIN), and
        # slotctl, holding the slot for it, says why rather than wait in silence.
        err = open(self.path("stderr"), "w+")
        self.addCleanup(err.close)
        p = subprocess.Popen([SLOTCTL, "run", "--lane", "merge", "--", "sh", "-c", "kill -TTIN $$; exit 5"],
                             env=self.env(), stdin=subprocess.DEVNULL, stderr=err)
        self.children.append(p)

        def reported():
            with open(self.path("stderr")) as f:
                return "stopped by SIGTTIN" in f.read()
        wait_for(reported, 10, "slotctl to report the stop")
        p.send_signal(signal.SIGINT)
        self.assertEqual(p.wait(10), 130)

    def test_an_ignored_sigchld_is_not_inherited(self):
        # A parent that ignores SIGCHLD passes that on through exec; the kernel would then reap the command
        # unseen, and slotctl would wait, holding the slot, for a status that never comes.
        def ignore_sigchld():
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        r = self.run_slotctl("run", "--lane", "merge", "--", "sh", "-c", "grep ^SigIgn: /proc/self/status; exit 3",
                             preexec_fn=ignore_sigchld, timeout=10)
        self.assertEqual(r.returncode, 3, r.stderr)
        # The command gets SIGCHLD's default disposition too, as it would from a shell.
        ignored = int(r.stdout.split()[1], 16)
        self.assertFalse(ignored & (1 << (signal.SIGCHLD - 1)), r.stdout)
        self.broker.wait_idle()

    def test_a_held_command_stopped_while_waiting_still_runs_when_granted(self):
        # Stopped before its grant (kill -STOP on its group), the held command could not take the word to go,
        # and slotctl, blocked until the exec, waited for it forever, deaf to every signal.
        stop = self.path("stop")
        holder = self.hold_until(stop)
        p = self.start_slotctl("run", "--lane", "nightly", "--", "sh", "-c", "exit 6")
        wait_for(lambda: len(self.broker.waiters()) == 1, 10, "the waiter to queue")
        [held] = children(p.pid)
        os.kill(int(held), signal.SIGSTOP)
        wait_for(lambda: process_state(int(held)) == "T", 10, "the held command to stop")
        open(stop, "w").close()
        self.assertEqual(holder.wait(10), 0)
        self.assertEqual(p.wait(10), 6)

    def test_sigkill_of_slotctl_while_waiting_withdraws_and_never_runs_the_command(self):
        # Nothing is left to clean up after: the connection's close withdraws the request, and the held
        # command dies with slotctl (PR_SET_PDEATHSIG) rather than start later on its own.
        stop = self.path("stop")
        holder = self.hold_until(stop)
        p = self.start_slotctl("run", "--lane", "nightly", "--", "touch", self.path("ran"))
        wait_for(lambda: len(self.broker.waiters()) == 1, 10, "the waiter to queue")
        [held] = children(p.pid)
        p.kill()
        p.wait()
        wait_for(lambda: not self.broker.waiters(), 5, "the waiter to be withdrawn")
        wait_for(lambda: not pid_alive(int(held)), 5, "the held command to die with slotctl")
        open(stop, "w").close()
        self.assertEqual(holder.wait(10), 0)
        self.broker.wait_idle()
        self.assertFalse(os.path.exists(self.path("ran")))

    def test_sigkill_of_slotctl_keeps_the_slot_until_the_command_exits(self):
        stop = self.path("stop")
        p = self.hold_until(stop)
        command = self.broker.holders()[0]["lease"]["commandPid"]
        p.kill()
        p.wait()
        # The connection is gone, the command runs: the slot stays held (SPEC §3.4), for as long as we look.
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            self.assertEqual(len(self.broker.holders()), 1)
            self.assertTrue(pid_alive(command))
            time.sleep(0.1)
        r = self.run_slotctl("run", "--lane", "merge", "--", "true")
        self.assertEqual(r.returncode, 75)
        open(stop, "w").close()
        wait_for(lambda: not self.broker.holders(), 5, "the slot to be freed once the command exited")

    def test_a_broker_that_does_not_answer_keeps_no_slotctl_once_its_command_exited(self):
        # brokerd stopped (SIGSTOP, a debugger, a hung host): the command exits, and slotctl tells the broker
        # its status; it waits for the answer a few seconds at most, and a signal cuts that short. Closing its
        # connection releases the lease anyway when the broker runs again: only the status is lost.
        broker = self.broker.proc.pid
        command = ["run", "--lane", "merge", "--", "sh", "-c", f"kill -STOP {broker}; exit 3"]
        try:
            start = time.monotonic()
            r = self.run_slotctl(*command, timeout=20)
            self.assertEqual(r.returncode, 3, r.stderr)
            self.assertIn("could not tell the broker the command's exit status", r.stderr)
            self.assertLess(time.monotonic() - start, 10)
            os.kill(broker, signal.SIGCONT)
            self.broker.wait_idle()

            p = self.start_slotctl(*command)
            # Reaped: slotctl has sent the Release and waits for its answer.
            wait_for(lambda: process_state(broker) == "T" and not children(p.pid), 10, "the command to stop brokerd")
            p.send_signal(signal.SIGTERM)
            self.assertEqual(p.wait(2), 3)
        finally:
            os.kill(broker, signal.SIGCONT)
        self.broker.wait_idle()

    def test_broker_going_away_leaves_the_command_running(self):
        stop = self.path("stop")
        p = self.hold_until(stop)
        os.kill(self.broker.proc.pid, signal.SIGKILL)
        self.broker.proc.wait()
        time.sleep(0.2)
        self.assertIsNone(p.poll(), "the command must keep running")
        open(stop, "w").close()
        self.assertEqual(p.wait(10), 0)
        self.assertIn("lost the connection to the broker", p.stderr.read())


class Terminal:
    """argv in a session of its own whose controlling terminal is a pseudo-terminal (pty.fork()): as a login
    shell's, argv[0] is the session's leader and the terminal's foreground. type() writes to it as a keyboard
    does; expect() waits for a pattern in what the terminal showed since the last expect()."""

    def __init__(self, argv, env):
        import pty
        self.pid, self.master = pty.fork()
        if self.pid == 0:
            try:
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        self.out = bytearray()
        self.seen = 0
        self.lock = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        while True:
            try:
                data = os.read(self.master, 4096)
            except OSError:  # EIO: the session's side is closed
                data = b""
            with self.lock:
                if not data:
                    self.out += b"\0EOF"
                    self.lock.notify_all()
                    return
                self.out += data
                self.lock.notify_all()

    def type(self, text):
        os.write(self.master, text.encode())

    def expect(self, pattern, timeout=10):
        deadline = time.monotonic() + timeout
        with self.lock:
            while True:
                m = re.search(pattern.encode(), self.out[self.seen:])
                if m:
                    self.seen += m.end()
                    return m
                left = deadline - time.monotonic()
                if left <= 0 or self.out.endswith(b"\0EOF"):
                    raise AssertionError(f"no {pattern!r} on the terminal; it showed: {bytes(self.out)!r}")
                self.lock.wait(left)

    def wait(self, timeout=10):
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.pid = 0
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                raise AssertionError("the terminal's session did not end")
            time.sleep(0.02)

    def close(self):
        if self.pid:
            try:
                os.killpg(self.pid, signal.SIGKILL)  # the session leader's group, and with it what it started
            except ProcessLookupError:
                pass
            os.waitpid(self.pid, 0)
            self.pid = 0
        self.reader.join(2)
        os.close(self.master)


class Foreground(SlotctlTest):
    """--foreground: the command gets the terminal slotctl is in the foreground of, as a shell's job."""

    def terminal(self, argv):
        try:
            # LC_ALL: bash's job messages ("Stopped") in English, whatever the machine's locale.
            t = Terminal(argv, self.env(PS1="$ ", TERM="dumb", LC_ALL="C"))
        except OSError as e:
            self.skipTest(f"no pseudo-terminal here: {e}")
        self.addCleanup(t.close)
        return t

    def test_the_command_reads_from_and_sets_the_terminal(self):
        # In the background of the terminal, `stty -echo` would stop the command (SIGTTOU) and `read` too.
        # (R$((1+1)) and the like: what the command prints, never what the terminal echoes of a line typed.)
        t = self.terminal([SLOTCTL, "run", "--foreground", "--lane", "merge", "--", "sh", "-c",
                           'stty -echo && echo R$((1+1)) && read a && stty echo && echo A$((1+1)):$a'])
        t.expect("R2")
        t.type("hello\n")
        t.expect("A2:hello")
        self.assertEqual(t.wait(), 0)
        self.broker.wait_idle()

    def test_the_terminal_comes_back_when_the_command_ends(self):
        # The shell after slotctl reads from the terminal: given back, or its read would fail (EIO: the
        # foreground would be a group gone, and the shell's group is orphaned here).
        t = self.terminal(["sh", "-c", f'"{SLOTCTL}" run --foreground --lane merge -- true; '
                                       'echo R$((1+1)); read b; echo B$((1+1)):$b'])
        t.expect("R2")
        t.type("again\n")
        t.expect("B2:again")
        self.assertEqual(t.wait(), 0)

    def test_ctrl_z_stops_the_job_and_fg_goes_on(self):
        # Under an interactive shell: Ctrl-Z stops the command, and slotctl (the shell's job) with it, so the
        # shell gets the terminal back; bg continues it in the background, where its read stops it, and the job,
        # again (SIGTTIN); fg gives it the terminal again.
        bash = shutil.which("bash")
        if not bash:
            self.skipTest("no bash for job control")
        t = self.terminal([bash, "--norc", "--noprofile", "-i"])
        t.expect(r"\$ ")
        t.type("set -b\n")  # job states said at once, not at the next prompt
        t.expect(r"\$ ")
        t.type(f"\"{SLOTCTL}\" run --foreground --lane merge -- sh -c "
               "'echo R$((1+1)); read a; echo A$((1+1)):$a'\n")
        t.expect("R2")
        t.type("\x1a")
        t.expect("Stopped")
        t.type("bg\n")
        t.expect("Stopped")
        self.assertEqual(len(self.broker.holders()), 1, "the stopped command holds its slot")
        t.type("fg\n")
        t.type("hello\n")
        t.expect("A2:hello")
        t.type('echo "S$((1+1)):$?"\n')
        t.expect("S2:0")
        t.type("exit\n")
        t.wait()
        self.broker.wait_idle()

    def test_ctrl_z_without_a_shell_goes_on(self):
        # slotctl leads the terminal's session: no shell could continue it, so its own stop is discarded (an
        # orphaned group), and the command, stopped by Ctrl-Z, goes on at once rather than hold its slot stopped.
        t = self.terminal([SLOTCTL, "run", "--foreground", "--lane", "merge", "--", "sh", "-c",
                           'echo R$((1+1)); read a; echo A$((1+1)):$a'])
        t.expect("R2")
        t.type("\x1a")
        t.type("hello\n")
        t.expect("A2:hello")
        self.assertEqual(t.wait(), 0)
        self.broker.wait_idle()

    def test_without_a_terminal_it_runs_as_without_the_option(self):
        r = self.run_slotctl("run", "--foreground", "--lane", "merge", "--", "sh", "-c", "exit 4",
                             start_new_session=True)
        self.assertEqual(r.returncode, 4, r.stderr)


class Timeouts(SlotctlTest):
    def test_timeout_kills_the_whole_group_and_exits_124(self):
        # The leader and its grandchild both ignore SIGTERM: only SIGKILL after --kill-after ends them.
        pidfile = self.path("grandchild")
        script = (f'sh -c \'echo $$ > "{pidfile}"; exec sleep 60\' & '
                  'wait')
        start = time.monotonic()
        r = self.run_slotctl("run", "--lane", "merge", "--timeout", "1s", "--kill-after", "1s", "--",
                             "sh", "-c", f'trap "" TERM; {script}')
        elapsed = time.monotonic() - start
        self.assertEqual(r.returncode, 124, r.stderr)
        self.assertIn("--timeout=1s reached", r.stderr)
        self.assertGreaterEqual(elapsed, 1.9)
        self.assertLess(elapsed, 10)
        grandchild = read_int(pidfile)
        wait_for(lambda: not pid_alive(grandchild), 5, "the grandchild to be gone")
        self.broker.wait_idle()

    def test_group_is_killed_when_the_leader_exits(self):
        # The leader ends on SIGTERM at once; what it left behind goes with it.
        pidfile = self.path("grandchild")
        r = self.run_slotctl("run", "--lane", "merge", "--timeout", "500ms", "--", "sh", "-c",
                             f'sh -c \'trap "" TERM; echo $$ > "{pidfile}"; exec sleep 60\' & sleep 60')
        self.assertEqual(r.returncode, 124, r.stderr)
        grandchild = read_int(pidfile)
        wait_for(lambda: not pid_alive(grandchild), 5, "the grandchild to be gone")

    def test_leftovers_are_killed_after_a_normal_exit(self):
        pidfile = self.path("grandchild")
        r = self.run_slotctl("run", "--lane", "merge", "--", "sh", "-c",
                             f'sh -c \'echo $$ > "{pidfile}"; exec sleep 60\' & '
                             f'while [ ! -s "{pidfile}" ]; do sleep 0.02; done; exit 4')
        self.assertEqual(r.returncode, 4, r.stderr)
        grandchild = read_int(pidfile)
        wait_for(lambda: not pid_alive(grandchild), 5, "the background process to be gone")
        self.broker.wait_idle()

    def test_max_hold_revocation_stops_the_command_with_124(self):
        start = time.monotonic()
        r = self.run_slotctl("run", "--lane", "short", "--", "sleep", "30")
        self.assertEqual(r.returncode, 124, r.stderr)
        self.assertIn("revoked", r.stderr)
        self.assertLess(time.monotonic() - start, 10)


class ExitStatusToBroker(SlotctlTest):
    """What slotctl run tells the broker when it releases (SPEC §3.6): a death by signal N as 128+N, and
    nothing for a command that slotctl itself stopped (--timeout)."""
    config = CONFIG + """
[pool flaky]
members = r1
quarantine-exit-codes = 139 3

[lane flaky]
pools = flaky
policy = wait
"""

    def quarantined(self):
        [pool] = [p for p in self.broker.status()["pools"] if p["name"] == "flaky"]
        return {q["member"]: q.get("exitStatus") for q in pool.get("quarantined", [])}

    def test_a_signal_death_is_told_as_128_plus_n_and_a_stop_by_slotctl_not_at_all(self):
        # Stopped by --timeout, the command exits 3 of its own on SIGTERM: 124 for slotctl, nothing for the broker.
        r = self.run_slotctl("run", "--lane", "flaky", "--timeout", "300ms", "--", "sh", "-c",
                             'trap "exit 3" TERM; while :; do sleep 0.05; done')
        self.assertEqual(r.returncode, 124, r.stderr)
        self.broker.wait_idle()
        self.assertEqual(self.quarantined(), {})
        r = self.run_slotctl("run", "--lane", "flaky", "--", "sh", "-c", "kill -SEGV $$")
        self.assertEqual(r.returncode, 139, r.stderr)
        self.assertEqual(r.stderr, "")
        wait_for(lambda: self.quarantined() == {"r1": 139}, 10, "r1 quarantined by 139")

class FencedTest(SlotctlTest):
    """slotctl run asks for fence; brokerd renews only where a lease needs it (shared pools), so these tests
    use brokerd's test hook, which renews every fenced lease every FENCE_MS / 4 with a fence of FENCE_MS."""
    FENCE_MS = 2000
    RENEWED = "Test hook: renewed"

    def setUp(self):
        self.broker = Broker(self.config, env={"SLOTBROKER_TEST_RENEW_MS": str(self.FENCE_MS),
                                               "SYSTEMD_LOG_LEVEL": "debug"})
        self.children = []

    def renewals(self):
        return self.broker.read_log().count(self.RENEWED)

    def start_fenced(self, script, kill_after="5s"):
        started = self.path("started")
        p = self.start_slotctl("run", "--lane", "merge", "--kill-after", kill_after, "--", "sh", "-c",
                               f'touch "{started}"; {script}')
        wait_for(lambda: os.path.exists(started), 10, "the command to start")
        # A renewal logged after the command started was sent after the grant (brokerd logs it once the
        # replies went out): slotctl has it in its socket, whatever becomes of brokerd now.
        seen = self.renewals()
        wait_for(lambda: self.renewals() > seen, 10 + self.FENCE_MS / 1000, "a renewal")
        return p


class Fencing(FencedTest):

    def test_stopped_broker_means_the_command_is_stopped_with_124(self):
        term = self.path("term")
        p = self.start_fenced(f'trap "touch \\"{term}\\"; exit 0" TERM; while :; do sleep 0.05; done')
        os.kill(self.broker.proc.pid, signal.SIGSTOP)
        try:
            rc = p.wait(30)
        finally:
            os.kill(self.broker.proc.pid, signal.SIGCONT)
        stderr = p.stderr.read()
        self.assertEqual(rc, 124, stderr)
        self.assertTrue(os.path.exists(term), "the command is told to stop with SIGTERM")
        self.assertIn("no renewal of the lease came in time", stderr)

    def test_renewed_lease_outlives_its_fence(self):
        # The command runs for more than two fences' worth of renewals: each renewal pushes the deadline on.
        stop = self.path("stop")
        p = self.start_fenced(f'while [ ! -e "{stop}" ]; do sleep 0.05; done')
        seen = self.renewals()
        wait_for(lambda: self.renewals() >= seen + 10, 30, "renewals for more than two fences")
        self.assertIsNone(p.poll(), "the command was stopped although renewals kept coming")
        open(stop, "w").close()
        self.assertEqual(p.wait(10), 0)


class FencedKillWithin(FencedTest):
    """A fenced command that ignores SIGTERM is killed within the broker's revoke-grace (killWithinMs), not
    after a longer --kill-after: by then its slots may be another node's."""
    config = "[broker]\nrevoke-grace = 1s\n\n" + CONFIG

    def test_fenced_command_is_killed_within_the_revoke_grace(self):
        p = self.start_fenced('trap "" TERM; while :; do sleep 0.05; done', kill_after="60s")
        os.kill(self.broker.proc.pid, signal.SIGSTOP)
        try:
            rc = p.wait(30)  # a fence (2 s) and the grace (1 s); --kill-after's 60 s would time this out
        finally:
            os.kill(self.broker.proc.pid, signal.SIGCONT)
        stderr = p.stderr.read()
        self.assertEqual(rc, 124, stderr)
        self.assertIn("no renewal of the lease came in time", stderr)


class FencedReclaim(FencedTest):
    # A fence that outlasts a restart of brokerd on a loaded machine.
    FENCE_MS = 12000

    def test_reclaim_after_a_restart_asks_for_renewals_again(self):
        stop = self.path("stop")
        p = self.start_fenced(f'while [ ! -e "{stop}" ]; do sleep 0.05; done')
        self.broker.kill_and_restart()
        # The new brokerd renews only a session that reclaimed the lease with fence.
        seen = self.renewals()
        wait_for(lambda: self.renewals() > seen, 20, "a renewal of the reclaimed lease")
        open(stop, "w").close()
        self.assertEqual(p.wait(10), 0)
        self.assertIn("reclaimed", p.stderr.read())


class Job(SlotctlTest):
    def job_seen_by_command(self, *args, **env):
        r = self.run_slotctl("run", "--lane", "merge", *args, "--", SLOTCTL, "status", "--json", env=self.env(**env))
        self.assertEqual(r.returncode, 0, r.stderr)
        holders = json.loads(r.stdout)["holders"]
        self.assertEqual(len(holders), 1)
        self.broker.wait_idle()
        return holders[0]["lease"].get("job")

    def test_job_defaults_from_ci_variables(self):
        self.assertIsNone(self.job_seen_by_command())
        self.assertEqual(self.job_seen_by_command(CI_JOB_URL="https://gitlab.example/g/p/-/jobs/42",
                                                  BUILD_URL="https://jenkins.example/job/1/"),
                         "https://gitlab.example/g/p/-/jobs/42")
        self.assertEqual(self.job_seen_by_command(GITHUB_SERVER_URL="https://github.com", GITHUB_REPOSITORY="o/r",
                                                  GITHUB_RUN_ID="123", GITHUB_JOB="build"),
                         "https://github.com/o/r/actions/runs/123 build")
        self.assertEqual(self.job_seen_by_command(BUILDKITE_BUILD_URL="https://buildkite.example/b/7"),
                         "https://buildkite.example/b/7")
        self.assertEqual(self.job_seen_by_command("--job", "mine", CI_JOB_URL="https://gitlab.example/x"), "mine")


    def test_a_ci_variable_that_is_not_utf8_does_not_fail_the_run(self):
        # A label is for people, and the job is not the CI's variable: a byte that is not UTF-8 (which the
        # protocol refuses) becomes "?" rather than exit 64. An explicit --job is the user's own: refused.
        self.assertEqual(self.job_seen_by_command(CI_JOB_URL="https://ci.example/\udcff\udce9/7 \u00e9"),
                         "https://ci.example/??/7 \u00e9")
        r = self.run_slotctl("run", "--lane", "merge", "--job", "bad\udcff", "--", "true")
        self.assertEqual(r.returncode, 64, r.stderr)

class Progress(SlotctlTest):
    def test_waiting_prints_one_plain_line_off_a_terminal(self):
        stop = self.path("stop")
        holder = self.hold_until(stop)
        waiter = self.start_slotctl("run", "--lane", "nightly", "--", "true")
        quiet = self.start_slotctl("run", "--lane", "nightly", "--quiet", "--", "true")
        wait_for(lambda: len(self.broker.waiters()) == 2, 10, "two waiters")
        open(stop, "w").close()
        self.assertEqual(holder.wait(10), 0)
        self.assertEqual(waiter.wait(20), 0)
        self.assertEqual(quiet.wait(20), 0)
        err = waiter.stderr.read()
        self.assertRegex(err, r"slotctl: waiting for a slot of pool grid: position [12] of [12], budget unbounded\n")
        self.assertIn("granted a slot of pool grid after", err)
        self.assertNotIn("\r", err)
        self.assertEqual(quiet.stderr.read(), "")


    def test_a_nested_run_that_waits_for_its_own_pool_says_so(self):
        # A job under slotctl run that runs slotctl run again on the same pool (a script calling a script)
        # may wait for the very slot its parent holds: it says so when it queues, rather than hang in
        # silence until its budget runs out.
        r = self.run_slotctl("run", "--lane", "merge", "--", SLOTCTL, "run", "--lane", "nightly", "--max-wait",
                             "500ms", "--", "true", timeout=20)
        self.assertEqual(r.returncode, 75, r.stderr)
        self.assertIn("already holds a slot of pool grid", r.stderr)
        # Another pool's wait is no such case.
        stop = self.path("stop")
        holder = self.hold_until(stop)
        r = self.run_slotctl("run", "--lane", "nightly", "--max-wait", "300ms", "--", "true",
                             env=self.env(SLOT_POOL="rigs", SLOT_LEASE="0" * 32))
        self.assertEqual(r.returncode, 75, r.stderr)
        self.assertNotIn("already holds", r.stderr)
        open(stop, "w").close()
        self.assertEqual(holder.wait(10), 0)

class Status(SlotctlTest):
    def test_status_shows_pools_holders_and_waiters(self):
        stop = self.path("stop")
        holder = self.hold_until(stop, "merge", "--job", "ci/holder")
        waiter = self.start_slotctl("run", "--lane", "nightly", "--job", "ci/waiter", "--", "true")
        wait_for(lambda: self.broker.waiters(), 10, "a waiter")
        lease = self.broker.holders()[0]["lease"]

        r = self.run_slotctl("status")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"grid\s+\[#\]\s+1/1 in use, 1 waiting")
        self.assertRegex(r.stdout, r"rigs\s+\[---\]\s+0/3 in use, 0 waiting")
        self.assertIn(lease["id"], r.stdout)
        self.assertIn("ci/holder", r.stdout)
        self.assertIn("ci/waiter", r.stdout)
        self.assertRegex(r.stdout, r"\n  1\s+nightly ")
        # Each column titled for what it holds: the lease's slot index, the waiter's place and its count.
        self.assertRegex(r.stdout, r"\n  LEASE\s+LANE\s+INDEX\s+UID\s")
        self.assertRegex(r.stdout, r"\n  PLACE\s+LANE\s+SLOTS\s+UID\s")

        r = self.run_slotctl("status", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        st = json.loads(r.stdout)
        self.assertEqual({p["name"] for p in st["pools"]}, {"grid", "rigs"})
        self.assertEqual(st["holders"][0]["lease"]["id"], lease["id"])
        self.assertEqual(st["waiters"][0]["job"], "ci/waiter")

        open(stop, "w").close()
        self.assertEqual(holder.wait(10), 0)
        self.assertEqual(waiter.wait(10), 0)

    def test_status_shows_the_holders_of_a_removed_pool(self):
        lease = self.run_slotctl("acquire", "--detach", "--max-hold", "1h", "--lane", "rig", "--job", "on-rigs").stdout.strip()
        self.assertRegex(lease, r"^[0-9a-f]{32}$")
        # A reload removes pool rigs (and lane rig); the lease is held until it is released (SPEC §3.4).
        self.broker.write_config(CONFIG.replace("[pool rigs]\nmembers = rig-a rig-b rig-c\n", "")
                                 .replace("[lane rig]\npools = rigs\npolicy = wait\n", ""))
        r = self.run_slotctl("reload")
        self.assertEqual(r.returncode, 0, r.stderr)
        st = json.loads(self.run_slotctl("status", "--json").stdout)
        self.assertEqual([p["name"] for p in st["pools"]], ["grid"])
        self.assertEqual([h["lease"]["id"] for h in st["holders"]], [lease])

        r = self.run_slotctl("status")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"\nrigs\s+removed from the configuration, 1 lease still held\n")
        self.assertRegex(r.stdout, rf"\n  {lease} rig\s+rig-\w\s.*detached\s+on-rigs\n")
        self.assertRegex(r.stdout, r"\n  LEASE\s+LANE\s+MEMBER\s+UID\s")
        self.assertEqual(self.run_slotctl("release", lease).returncode, 0)
        self.assertNotIn("rigs", self.run_slotctl("status").stdout)

    # What a user who can reach the socket puts in --job: OSC (retitle), BEL, CR (overwrite the line),
    # DEL, a C1 CSI, a right-to-left override and a backslash; escaped it is 40 bytes, one job column.
    HOSTILE_JOB = "a\x1b]0;x\x07b\x1b\rc\x7f\u009b\u202e\\d"
    HOSTILE_JOB_PRINTED = "a\\x1b]0;x\\x07b\\x1b\\rc\\x7f\\u009b\\u202e\\\\d"
    # The history keeps it as one line (control characters, C1 included, as "?"); a bidi override is text.
    HOSTILE_JOB_ONE_LINE = "a?]0;x?b??c??\u202e\\d"
    HOSTILE_JOB_ONE_LINE_PRINTED = "a?]0;x?b??c??\\u202e\\\\d"

    def assert_printable(self, text):
        self.assertFalse(re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", text), repr(text))

    def test_status_and_history_escape_what_clients_sent(self):
        stop = self.path("stop")
        holder = self.hold_until(stop, "merge", "--job", self.HOSTILE_JOB)
        waiter = self.start_slotctl("run", "--lane", "nightly", "--job", self.HOSTILE_JOB, "--", "true")
        wait_for(lambda: self.broker.waiters(), 10, "a waiter")

        r = self.run_slotctl("status")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_printable(r.stdout)
        self.assertEqual(r.stdout.count(self.HOSTILE_JOB_PRINTED), 2, r.stdout)  # the holder and the waiter
        # JSON output is exact.
        st = json.loads(self.run_slotctl("status", "--json").stdout)
        self.assertEqual(st["holders"][0]["lease"]["job"], self.HOSTILE_JOB)

        open(stop, "w").close()
        self.assertEqual(holder.wait(10), 0)
        self.assertEqual(waiter.wait(10), 0)
        self.broker.wait_idle()
        r = self.run_slotctl("history")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_printable(r.stdout)
        self.assertIn(self.HOSTILE_JOB_ONE_LINE_PRINTED, r.stdout)
        events = json.loads(self.run_slotctl("history", "--json").stdout)["events"]
        jobs = {e.get("job") for e in events}
        self.assertIn(self.HOSTILE_JOB_ONE_LINE, jobs)
        self.assertNotIn(self.HOSTILE_JOB, jobs)

    def test_history_ranges_that_hold_nothing(self):
        """--until @0 (brokerd took an until of 0 for no until: every event) and --since after --until."""
        self.assertEqual(self.run_slotctl("run", "--lane", "merge", "--", "true").returncode, 0)
        wait_for(lambda: json.loads(self.run_slotctl("history", "--json").stdout)["events"], 10, "the events")
        for args in (("--until", "@0"), ("--since", "@2000000000", "--until", "@1000000000")):
            r = self.run_slotctl("history", "--json", *args)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(json.loads(r.stdout)["events"], [], args)

    def test_history_json_is_written_page_by_page(self):
        """slotctl history --json of a long history: memory of a page, not of every event (it kept them all as
        one JSON tree: 86 MB for these 50,000 events, gigabytes for a month of a busy CI)."""
        n = 50_000
        os.kill(self.broker.proc.pid, signal.SIGTERM)
        self.broker.proc.wait(10)
        db = sqlite3.connect(os.path.join(self.broker.dir, "state", "history.db"))
        t0 = int(time.time() * 1e6) - n * 1000
        db.executemany("INSERT INTO events (time, decision, pool, lane, job) VALUES (?, 'busy', 'grid', 'merge', ?)",
                       ((t0 + i * 1000, f"https://ci.example/job/{i}") for i in range(n)))
        db.commit()
        db.close()
        if os.path.exists(self.broker.socket):
            os.unlink(self.broker.socket)
        self.broker.start()

        # Under ASan, freed memory waits in a 256 MB quarantine before reuse: off, so that the peak is slotctl's.
        asan = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS", ""), "quarantine_size_mb=0"]))
        p = self.start_slotctl("history", "--json", env=self.env(ASAN_OPTIONS=asan))
        out = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        self.assertEqual(p.returncode, 0, p.stderr.read())
        events = json.loads(out)["events"]
        self.assertEqual(len(events), n)
        self.assertEqual(events[-1]["job"], f"https://ci.example/job/{n - 1}")
        self.assertLess(usage.ru_maxrss, 40 * 1024, "KiB")
        # The same JSON as before: one object, compact, a newline at the end.
        self.assertTrue(out.startswith('{"events":[{"id":'), out[:40])
        self.assertTrue(out.endswith("}]}\n"), out[-40:])
        limited = self.run_slotctl("history", "--json", "--limit", "3").stdout
        self.assertEqual([e["id"] for e in json.loads(limited)["events"]], [e["id"] for e in events[:3]])
        empty = self.run_slotctl("history", "--json", "--until", "@1").stdout
        self.assertEqual(empty, '{"events":[]}\n')


class Detached(SlotctlTest):
    def test_acquire_detach_and_release(self):
        r = self.run_slotctl("acquire", "--detach", "--max-hold", "1h", "--lane", "merge", "--job", "setup")
        self.assertEqual(r.returncode, 0, r.stderr)
        lease = r.stdout.strip()
        self.assertRegex(lease, r"^[0-9a-f]{32}$")
        # Held by nobody: slotctl has exited and the slot is still taken.
        holders = self.broker.holders()
        self.assertEqual([h["lease"]["id"] for h in holders], [lease])
        self.assertTrue(holders[0]["lease"]["detached"])
        self.assertEqual(self.run_slotctl("run", "--lane", "merge", "--", "true").returncode, 75)

        r = self.run_slotctl("release", lease)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.broker.holders(), [])
        r = self.run_slotctl("release", lease)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no lease", r.stderr)

    def test_acquire_json_and_max_hold(self):
        r = self.run_slotctl("acquire", "--detach", "--max-hold", "1s", "--lane", "merge", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        lease = json.loads(r.stdout)
        self.assertTrue(lease["detached"])
        self.assertEqual(lease["pool"], "grid")
        self.assertGreater(lease["expiresAt"], lease["grantedAt"])
        wait_for(lambda: not self.broker.holders(), 5, "max-hold to end the detached lease")

    def test_acquire_refused_and_only_detached(self):
        stop = self.path("stop")
        holder = self.hold_until(stop)
        r = self.run_slotctl("acquire", "--detach", "--max-hold", "1h", "--lane", "merge")
        self.assertEqual(r.returncode, 75)
        self.assertEqual(r.stdout, "")
        r = self.run_slotctl("acquire", "--max-hold", "1h", "--lane", "merge")
        self.assertEqual(r.returncode, 64)
        open(stop, "w").close()
        holder.wait(10)


class Admin(SlotctlTest):
    def test_drain_and_undrain(self):
        r = self.run_slotctl("drain", "grid")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(self.broker.status()["pools"][0]["drained"])
        self.assertIn("drained", self.run_slotctl("status").stdout)
        r = self.run_slotctl("run", "--lane", "merge", "--", "true")
        self.assertEqual(r.returncode, 75)
        self.assertIn("refused (unavailable)", r.stderr)
        r = self.run_slotctl("undrain", "grid")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.run_slotctl("run", "--lane", "merge", "--", "true").returncode, 0)

        r = self.run_slotctl("drain", "nope")
        self.assertEqual(r.returncode, 64)
        self.assertIn('no pool "nope"', r.stderr)
        r = self.run_slotctl("drain", "rigs", "rig-z")
        self.assertEqual(r.returncode, 64)
        self.assertIn('pool rigs has no member "rig-z"', r.stderr)
        r = self.run_slotctl("drain", "nope", "rig-z")
        self.assertEqual(r.returncode, 64)
        self.assertIn('no pool "nope"', r.stderr)
        # Drained members are passed over.
        self.assertEqual(self.run_slotctl("drain", "rigs", "rig-a").returncode, 0)
        self.assertEqual(self.run_slotctl("drain", "rigs", "rig-b").returncode, 0)
        r = self.run_slotctl("run", "--lane", "rig", "--", "sh", "-c", 'echo "$SLOT_MEMBER"')
        self.assertEqual((r.returncode, r.stdout), (0, "rig-c\n"), r.stderr)
        self.assertEqual(self.run_slotctl("undrain", "rigs", "rig-a").returncode, 0)

    def test_drain_refuses_waiters(self):
        stop = self.path("stop")
        holder = self.hold_until(stop)
        waiter = self.start_slotctl("run", "--lane", "nightly", "--", "true")
        wait_for(lambda: self.broker.waiters(), 10, "a waiter")
        self.assertEqual(self.run_slotctl("drain", "grid").returncode, 0)
        self.assertEqual(waiter.wait(10), 75)
        self.assertIn("refused (unavailable)", waiter.stderr.read())
        open(stop, "w").close()
        holder.wait(10)

    def test_cancel_refuses_matching_waiters(self):
        stop = self.path("stop")
        holder = self.hold_until(stop)
        waiter = self.start_slotctl("run", "--lane", "nightly", "--job", "victim", "--", "true")
        wait_for(lambda: self.broker.waiters(), 10, "a waiter")
        r = self.run_slotctl("cancel", "--lane", "merge")
        self.assertEqual((r.returncode, r.stdout), (0, "Cancelled 0 waiting requests.\n"))
        r = self.run_slotctl("cancel", "--job", "victim", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout), {"cancelled": 1})
        self.assertEqual(waiter.wait(10), 75)
        self.assertIn("cancelled", waiter.stderr.read())
        self.assertEqual(self.run_slotctl("cancel").returncode, 64)  # no filter: --all is needed
        self.assertEqual(self.run_slotctl("cancel", "--all").stdout, "Cancelled 0 waiting requests.\n")
        open(stop, "w").close()
        holder.wait(10)

    def test_reload_applies_or_reports_every_error(self):
        self.broker.write_config(CONFIG + "\n[lane broken]\npools = missing\nbogus = 1\n")
        r = self.run_slotctl("reload")
        self.assertEqual(r.returncode, 1)
        self.assertIn("reload failed", r.stderr)
        self.assertRegex(r.stderr, r"brokerd\.conf:\d+: bogus")
        self.assertRegex(r.stderr, r"brokerd\.conf:\d+: pools: .*missing")
        # The old configuration stays.
        self.assertEqual({p["name"] for p in self.broker.status()["pools"]}, {"grid", "rigs"})

        self.broker.write_config(CONFIG + "\n[pool extra]\nlimit = 2\n")
        r = self.run_slotctl("reload")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("extra", {p["name"] for p in self.broker.status()["pools"]})

    def test_unreachable_broker_for_every_verb_is_69(self):
        missing = self.path("no-such-socket")
        for args in (["status"], ["drain", "grid"], ["reload"], ["cancel", "--all"], ["release", "x"],
                     ["acquire", "--detach", "--max-hold", "1m", "--lane", "merge"]):
            r = self.run_slotctl(*args, "--socket", missing)
            self.assertEqual(r.returncode, 69, f"{args}: {r.stderr}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    SLOTCTL = os.path.abspath(sys.argv[1])
    BROKERD = os.path.abspath(sys.argv[2])
    unittest.main(argv=[sys.argv[0], "-v", *sys.argv[3:]])
