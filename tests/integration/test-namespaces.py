#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""slotctl run from another PID namespace than brokerd's (issue 9, section 3): a CI job's container with
the host's socket mounted in. slotctl names its command with a pidfd passed over the socket (SCM_RIGHTS);
brokerd finds the process in its own namespace, checks it is slotctl's child, and ties the lease to it.

Each environment gets the same checks, with a witness from the command's side (it writes its
SLOT_TOKEN):
- the command runs with the slot, and slotctl exits with the command's status (before the fix: 64,
  "the broker refused parameter pid");
- the lease names the command by its pid in brokerd's namespace (commandPid), the uid brokerd sees is
  the host's (a user namespace's mapping applied), and the command really lives in a child namespace;
- a fail-fast request from another container is refused (75) while it runs;
- SIGKILL of slotctl keeps the slot while the command runs;
- SIGKILL and restart of brokerd restore the lease from the command's pid and start time: still refused;
- when the command ends, the slot frees: the fail-fast request from the container is granted.
- slotctl alive across a restart of brokerd reconnects and reclaims its lease (its command passed again):
  a Release from the host then reaches it, and it stops the command (124).

Environments: a PID namespace (unshare --pid, as root); a user + PID namespace entered as nobody
(unshare --user --map-root-user --pid); a Debian 12 root (tests/systemd/container.sh's tree) chrooted into in
new mount + PID namespaces with brokerd's directory bind-mounted at /run/brokerd and slotctl copied in, as
GitLab Runner's docker executor does with volumes = ["/run/brokerd:/run/brokerd"]. Each is skipped when it
cannot be made here (no root, unshare refused, no tree: container.sh exit 77).

Usage: test-namespaces.py BROKERD SLOTCTL CONTAINER_SH [unittest arguments]
"""
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True
import harness  # noqa: E402
from harness import NOBODY_UID, NOGROUP_GID, wait_for  # noqa: E402

SLOTCTL = None
CONTAINER_SH = None

CONFIG = """\
[pool grid]
limit = 1

[lane w]
pools = grid
policy = wait

[lane ff]
pools = grid
policy = fail-fast
"""


def can_run(argv):
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ns_pids(pid):
    """The NSpid line of /proc/PID/status: the pid in each namespace from ours down to its own."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    return []


def proc_ppid(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def proc_uid(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    raise AssertionError(f"no Uid: line for pid {pid}")


def gone(pid):
    """True once pid has exited and been reaped (a zombie is not gone)."""
    return not os.path.exists(f"/proc/{pid}")


class Environment:
    """Where slotctl runs: .argv(script) runs a sh script as PID 1 of new namespaces; the script reaches
    slotctl as $SLOTCTL and the shared directory as $W. PID 1 reaps the orphans (a command whose slotctl
    was killed) as a container's init does, and the namespaces end when it does."""

    uid = 0
    name = "?"

    def __init__(self, work):
        self.work = work

    def wrap(self, script):
        raise NotImplementedError

    def argv(self, script):
        return self.wrap(f"export SLOTCTL={shlex.quote(self.slotctl)} W={shlex.quote(self.w)}; {script}")


class PidNamespace(Environment):
    name = "pid namespace"

    def __init__(self, work, socket_path):
        super().__init__(work)
        self.slotctl = SLOTCTL
        self.w = work
        self.socket = socket_path

    def prefix(self):
        return ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]

    def wrap(self, script):
        return ["env", f"SLOTBROKER_SOCKET={self.socket}"] + self.prefix() + ["sh", "-c", script]


class UserPidNamespace(PidNamespace):
    """Entered as nobody: brokerd must see the host's uid (65534), not the namespace's root."""
    name = "user + pid namespace"
    uid = NOBODY_UID

    def __init__(self, work, socket_path):
        super().__init__(work, socket_path)
        # The build tree may not be open to nobody: a copy beside the witness files is.
        self.slotctl = os.path.join(work, "slotctl")
        shutil.copy(SLOTCTL, self.slotctl)
        os.chmod(self.slotctl, 0o755)

    def prefix(self):
        return ["setpriv", f"--reuid={NOBODY_UID}", f"--regid={NOGROUP_GID}", "--clear-groups",
                "unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "--kill-child"]


class ContainerRoot(Environment):
    """A Debian 12 root as a job image: brokerd's directory at /run/brokerd (the default socket for root,
    no SLOTBROKER_SOCKET), slotctl in /usr/local/bin. The bind mounts live in the private mount namespace
    alone, and go with it."""
    name = "container root"

    def __init__(self, work, root, broker_dir):
        super().__init__(work)
        self.root = root
        self.broker_dir = broker_dir
        self.slotctl = "/usr/local/bin/slotctl"
        self.w = "/work"
        for d in ("run/brokerd", "work"):
            os.makedirs(os.path.join(root, d), exist_ok=True)
        shutil.copy(SLOTCTL, os.path.join(root, "usr/local/bin/slotctl"))

    def wrap(self, script):
        r = shlex.quote(self.root)
        setup = (f"mount --make-rprivate / && mount --bind {shlex.quote(self.broker_dir)} {r}/run/brokerd && "
                 f"mount --bind {shlex.quote(self.work)} {r}/work && mount -t proc proc {r}/proc && "
                 f"exec chroot {r} /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin /bin/sh -c {shlex.quote(script)}")
        return ["unshare", "--mount", "--pid", "--fork", "--kill-child", "sh", "-c", setup]


class NamespaceChecks:
    """The checks of the module docstring, for the environment make_environment() builds (a mixin: each
    environment's TestCase runs them)."""

    def make_environment(self, work, broker):
        raise NotImplementedError

    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("needs root: unshare --pid")
        self.work = tempfile.mkdtemp(prefix="test-namespaces-")
        os.chmod(self.work, 0o777)  # nobody's command writes its witness here
        self.addCleanup(shutil.rmtree, self.work, ignore_errors=True)
        self.b = self.broker(CONFIG, "brokerd")
        self.env = self.make_environment(self.work, self.b)
        self.procs = []
        self.addCleanup(self.kill_all)

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()  # --kill-child: its PID 1 dies, and with it everything in the namespace
                p.wait()

    def spawn(self, script):
        p = subprocess.Popen(self.env.argv(script), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        self.procs.append(p)
        return p

    def run_in(self, script, timeout=30):
        """Runs script in a fresh instance of the environment; returns (status, output)."""
        p = self.spawn(script)
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out

    def fail_fast(self):
        """A fail-fast request from another container, with a command that proves it ran."""
        return self.run_in('"$SLOTCTL" run --lane ff --quiet -- sh -c \'test -n "$SLOT_LEASE"\'')

    def holder(self):
        holders = self.b.status()["holders"]
        self.assertEqual(len(holders), 1, holders)
        return holders[0]

    def test_slotctl_runs_its_command_with_the_slot(self):
        status, out = self.run_in('"$SLOTCTL" run --lane w -- sh -c \'test -n "$SLOT_TOKEN" && exit 3\'')
        self.assertEqual(status, 3, out)
        self.b.wait_idle()

    def test_lease_held_by_the_command_across_slotctl_kill_and_broker_restart(self):
        b = self.b
        witness = os.path.join(self.work, "witness")
        # PID 1 runs slotctl in the background and reaps orphans (every 0.2 s) until told to stop.
        ns = self.spawn('"$SLOTCTL" run --lane w --job ns -- sh -c \'echo "$SLOT_TOKEN" >"$W/witness"; '
                        'while [ ! -e "$W/release" ]; do sleep 0.05; done\' & '
                        'while [ ! -e "$W/stop" ]; do sleep 0.2; done')
        self.addCleanup(lambda: open(os.path.join(self.work, "stop"), "w").close())

        def witnessed():
            if ns.poll() is not None:
                raise AssertionError(f"the {self.env.name} ended early: {ns.stdout.read()}")
            return os.path.exists(witness) and harness.read_text(witness).strip()

        token = int(wait_for(witnessed, 15, message="the command's witness"))
        h = self.holder()
        lease = h["lease"]
        self.assertEqual(lease["token"], token)
        self.assertEqual(lease["uid"], self.env.uid)
        slotctl_pid, command_pid = lease["pid"], lease["commandPid"]
        # commandPid is the command as brokerd numbers it; it lives in a namespace of its own below ours.
        self.assertGreaterEqual(len(ns_pids(command_pid)), 2, ns_pids(command_pid))
        self.assertEqual(proc_uid(command_pid), self.env.uid)
        self.assertEqual(proc_ppid(command_pid), slotctl_pid)

        status, out = self.fail_fast()
        self.assertEqual(status, 75, out)

        # slotctl dies: the command holds the slot alone.
        os.kill(slotctl_pid, signal.SIGKILL)
        wait_for(lambda: gone(slotctl_pid), message="slotctl to be reaped by the namespace's PID 1")
        wait_for(lambda: not b.client_connections(), message="brokerd to see slotctl's connection close")
        self.assertEqual(self.holder()["lease"]["id"], lease["id"])
        status, out = self.fail_fast()
        self.assertEqual(status, 75, out)

        # brokerd crashes and comes back: the lease is restored from the command's pid and start time.
        b.crash()
        b.start()
        h = self.holder()
        self.assertEqual(h["lease"]["id"], lease["id"])
        self.assertEqual(h["lease"]["commandPid"], command_pid)
        status, out = self.fail_fast()
        self.assertEqual(status, 75, out)

        # The command ends: the slot frees, and the container's next request gets it.
        open(os.path.join(self.work, "release"), "w").close()
        wait_for(lambda: gone(command_pid), message="the command to end")
        b.wait_idle()
        status, out = self.fail_fast()
        self.assertEqual(status, 0, out)

        open(os.path.join(self.work, "stop"), "w").close()
        ns.communicate(timeout=10)

    def test_slotctl_reclaims_its_lease_after_a_broker_restart(self):
        b = self.b
        witness, status = os.path.join(self.work, "witness"), os.path.join(self.work, "status")
        ns = self.spawn('"$SLOTCTL" run --lane w -- sh -c \'echo "$SLOT_TOKEN" >"$W/witness"; exec sleep 600\'; '
                        'echo $? >"$W/status"')
        wait_for(lambda: os.path.exists(witness) and harness.read_text(witness).strip(), 15,
                 message="the command's witness")
        lease = self.holder()["lease"]

        b.crash()
        b.start()
        # slotctl comes back by itself (Acquire with reclaim, its command passed again): its connection is
        # the lease's life line once more.
        wait_for(lambda: "Lease %s reclaimed" % lease["id"] in b.log(), 15, message="slotctl to reclaim its lease")
        h = self.holder()
        self.assertEqual((h["lease"]["id"], h["state"]), (lease["id"], "held"))
        # A Release from the host now reaches slotctl in its namespace: it stops the command, exit 124.
        b.call("io.slotbroker.Release", {"lease": lease["id"]})
        wait_for(lambda: os.path.exists(status) and harness.read_text(status).strip(), 15, message="slotctl's exit")
        self.assertEqual(harness.read_text(status).strip(), "124")
        b.wait_idle()
        ns.communicate(timeout=10)


class PidNamespaceTest(NamespaceChecks, harness.BrokerTestCase):
    def make_environment(self, work, broker):
        if not can_run(["unshare", "--pid", "--fork", "--mount-proc", "true"]):
            self.skipTest("unshare --pid is not permitted here")
        return PidNamespace(work, broker.socket_path)


class UserPidNamespaceTest(NamespaceChecks, harness.BrokerTestCase):
    def make_environment(self, work, broker):
        if not can_run(["setpriv", f"--reuid={NOBODY_UID}", f"--regid={NOGROUP_GID}", "--clear-groups", "unshare",
                        "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "true"]):
            self.skipTest("unprivileged user namespaces are not permitted here")
        return UserPidNamespace(work, broker.socket_path)


class ContainerRootTest(NamespaceChecks, harness.BrokerTestCase):
    root = None
    build_status = None
    build_error = "needs root"

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            return
        if not can_run(["unshare", "--mount", "--pid", "--fork", "true"]):
            cls.build_error = "unshare --mount --pid is not permitted here"
            return  # no tree built for nothing
        cls.root = tempfile.mkdtemp(prefix="test-namespaces-root-", dir="/var/tmp")
        p = subprocess.run(["bash", CONTAINER_SH, "build", cls.root], capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            cls.build_status = p.returncode
            cls.build_error = f"container.sh build exited {p.returncode}: {p.stderr.strip()[-500:]}"
            shutil.rmtree(cls.root, ignore_errors=True)
            cls.root = None

    @classmethod
    def tearDownClass(cls):
        if cls.root:
            with open("/proc/self/mountinfo") as f:
                mounted = [line for line in f if cls.root in line]
            if not mounted:  # never remove a tree something is still mounted in
                shutil.rmtree(cls.root, ignore_errors=True)

    def make_environment(self, work, broker):
        if not self.root:
            if self.build_status not in (None, 77):  # 77: no debootstrap, or no mirror: cannot be built here
                self.fail(self.build_error)
            self.skipTest(self.build_error)
        return ContainerRoot(work, self.root, broker.dir)


if __name__ == "__main__":
    (_, SLOTCTL, CONTAINER_SH), argv = harness.arguments(__doc__, 3)
    harness.main(argv)
