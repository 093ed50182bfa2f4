#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A rig's life through the real brokerd and `slotctl run` (SPEC §3.6, issue 23 items 1, 2, 6), witnessed by
the commands (witness.py: a member held twice fails the test from the commands' side).

Rigs a b of pool rigs, quarantine-exit-codes = 3 4, quarantine-after = 1 (and = 2 in its own test):
- `slotctl run --member a -- … exit 3` exits 3, and a is quarantined: Status says since when, which job,
  which status, `slotctl status` prints it, the metrics say slotbroker_member_quarantined 1; an ordinary
  request for a waits; a health lane's job is granted a at once, past it; its exit 1 keeps a quarantined
  (the next health job gets it), its exit 0 restores a, which then goes to the ordinary waiter.
- An exit status that is not listed, or none told (a raw client that releases without one), quarantines
  nothing; quarantine-after = 2 needs two in a row.
- `slotctl quarantine POOL MEMBER --reason` and `slotctl restore`: root and the pool's admin-users=; a
  non-admin is PermissionDenied (protocol, as nobody); bad input is a clear error and changes nothing: a
  member or pool that does not exist, no reason, a reason of 1 MB or with control characters, a pool of
  anonymous slots.
- A set (lane with also=): its exit 3 quarantines the rig it held in its also= pool too, whose history rows
  name the rig for `slotctl report`. A health lane with allow-users= is refused to others, who restore nothing.
- A job label with a control character, or empty, quarantines as any (its label kept as one line, or none), and
  members.state with it reads back after a restart (Drain class); on a shared pool no node takes the record
  for malformed input from Redis (Shared class).
- A lease held across a handover to a configuration without its pool (restored into a pool kept for it alone):
  its job's exit 3 quarantines the member, and a health job's exit 0 restores it, once a reload brings the pool
  back (Drain class).
- A job's exit status told while brokerd restarts through the fd store (its Release waiting in the connection
  the store kept) quarantines (exit 3) or restores (a health job's exit 0) as without the restart; a waiter for
  a member whose drain's --until came during such a restart gets it (Drain class).
- Journal (Journal class, inside journald-ns.sh): [QUARANTINED] and [RESTORED] with their MESSAGE_IDs, in
  the catalog, and SLOT_MEMBER, SLOT_JOB, SLOT_EXIT_STATUS, SLOT_REASON; [ADMIN_DENIED] for a non-admin.

Shared (a pool shared through Redis, two brokerds on one redis-server; a SKIP without redis-server):
`slotctl run`'s exit 3 on node A quarantines the member for both nodes (Status with the node, `slotctl
status`, the metric), neither grants it; `slotctl restore` on A and `slotctl quarantine`/`restore` on B
are seen and obeyed by the other; a health job on B is granted the member past A's ordinary waiter, its exit
1 keeps it quarantined, its exit 0 restores it for both (A's waiter gets it); `slotctl drain --until` on A
ends by itself and B's waiter gets the member; a restarted brokerd reads the quarantine back from Redis;
each node counts its own leases and quarantines per member (the metrics, across a restart, and `slotctl
report` on its history); a health = also job takes the quarantined member first and its exit 0 restores it.

Usage: test-quarantine.py BROKERD SLOTCTL CATALOG [unittest arguments]
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
import harness  # noqa: E402
import journal as journal_ns  # noqa: E402
from harness import wait_for  # noqa: E402
from witness import Witness  # noqa: E402

SLOTCTL = None
CATALOG = None
EX_USAGE = 64
EX_NOPERM = 77

CONFIG = """\
[pool rigs]
members = a b
quarantine-exit-codes = 3 4
quarantine-after = {after}
admin-users = {admin}

[pool anon]
limit = 2

[lane w]
pools = rigs
policy = wait

[lane health]
pools = rigs
policy = wait
health = yes

[lane anon]
pools = anon
"""

MESSAGE_ID_QUARANTINED = "096728e987954e00b546875ad4d4702f"
MESSAGE_ID_RESTORED = "1c4072a236bf4467b046510ca437cf58"
MESSAGE_ID_ADMIN_DENIED = "ce066070d74145a5b694680bb79d417d"
MESSAGE_ID_DRAINED = "840f5480322440e6ae1f59eca753a42b"
MESSAGE_ID_UNDRAINED = "9745f6d228a9456e9c5188821c7db415"


class Base(harness.BrokerTestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="quarantine-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.w = Witness(self.dir)
        self.addCleanup(self.w.check, self)
        self.jobs = {}

    def rigs(self, name, after=1, admin="12345"):
        return self.broker(CONFIG.format(after=after, admin=admin), name)

    def job(self, b, name, lane, body, *options):
        j = harness.SlotctlRun(SLOTCTL, b.socket_path, lane, self.w.command(body, name), "--job", name, *options)
        self.addCleanup(j.kill)
        self.jobs[name] = j
        return j

    def ran(self, b, name, lane, exit_status, *options):
        """A job that runs on its member and exits with exit_status: slotctl exits with it too."""
        j = self.job(b, name, lane, f"finish; exit {exit_status}", *options)
        self.assertEqual(j.wait(20), exit_status, j.stderr())
        return self.w.started(name)[0].slots

    def running(self, b, name, lane, *options, exit_status=0):
        """A job that got its members and runs until stop(name), then exits with exit_status."""
        j = self.job(b, name, lane, f'while [ ! -e "$d/stop-$n" ]; do sleep 0.02; done; finish; exit {exit_status}',
                     *options)
        got = wait_for(lambda: self.w.started(name) or j.proc.poll() is not None, 10, message=f"{name} to start")
        self.assertIsNot(got, True, j.stderr())
        return got[0].slots

    def queued(self, b, name, lane, *options):
        j = self.job(b, name, lane, 'while [ ! -e "$d/stop-$n" ]; do sleep 0.02; done', *options)
        wait_for(lambda: "waiting for" in j.stderr() or j.proc.poll() is not None, 10, message=f"{name} queued")
        self.assertIsNone(j.proc.poll(), j.stderr())
        return j

    def stop(self, name, exit_status=0):
        self.w.stop(name)
        self.assertEqual(self.jobs[name].wait(10), exit_status, self.jobs[name].stderr())

    def quarantined(self, b):
        return {q["member"]: q for q in b.pool("rigs").get("quarantined", [])}

    def wait_quarantined(self, b, members):
        wait_for(lambda: set(self.quarantined(b)) == set(members), 10, message=f"quarantined = {members}")
        return self.quarantined(b)

    def slotctl(self, b, *args, **kw):
        return subprocess.run([SLOTCTL, args[0], "--socket", b.socket_path, *args[1:]], capture_output=True,
                              text=True, timeout=30, **kw)

    def report_members(self, b, name):
        """Stops b and draws `slotctl report` on a copy of its history: {member: (grants, holds, failures,
        quarantines)} of its table per member."""
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        path = os.path.join(self.dir, f"{name}.db")
        shutil.copy(os.path.join(b.state_dir, "history.db"), path)
        p = subprocess.run([SLOTCTL, "report", "--history", path, "-o", "-"], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = {m: dict(re.findall(r'data-([a-z-]+)="([^"]*)"', attrs))
                for m, attrs in re.findall(r'<tr data-member="(\w+)"([^>]*)>', p.stdout)}
        return {m: (r["grants"], r["holds"], r["failures"], r["quarantines"]) for m, r in rows.items()}

    def member_counts(self, b):
        """{(series, member): value} of the per-member metrics of pool rigs."""
        text = b.call("io.slotbroker.Metrics")["text"]
        got = {}
        for name, member, value in re.findall(
                r'^slotbroker_member_(grants_total|held_seconds_total|quarantines_total)\{pool="rigs",member="(\w+)"\} (\S+)$',
                text, re.M):
            got[(name, member)] = float(value)
        return got


class Quarantine(Base):

    def test_exit_status_quarantines_and_a_health_job_restores(self):
        b = self.rigs("exit")
        self.assertEqual(self.ran(b, "broken", "w", 3, "--member", "a"), ["a"])
        q = self.wait_quarantined(b, {"a"})["a"]
        self.assertEqual(q["job"], "broken")
        self.assertEqual(q["exitStatus"], 3)
        self.assertNotIn("reason", q)
        self.assertLess(abs(q["since"] / 1e6 - __import__("time").time()), 60)
        text = self.slotctl(b, "status").stdout
        self.assertRegex(text, r"a quarantined since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d by job broken \(exit 3\)")
        metrics = b.call("io.slotbroker.Metrics")["text"]
        self.assertIn('slotbroker_member_quarantined{pool="rigs",member="a"} 1', metrics)
        self.assertIn('slotbroker_member_quarantined{pool="rigs",member="b"} 0', metrics)
        self.assertIn('slotbroker_member_quarantines_total{pool="rigs",member="a"} 1', metrics)
        self.assertIn('slotbroker_member_grants_total{pool="rigs",member="a"} 1', metrics)
        self.assertRegex(metrics, r'slotbroker_member_held_seconds_total\{pool="rigs",member="a"\} \d+\.\d{6}\n')

        # An ordinary request for a waits; one for any member gets b.
        self.queued(b, "ordinary", "w", "--member", "a")
        self.assertEqual(self.running(b, "other", "w"), ["b"])
        # A health job is granted a at once, past the ordinary waiter; a health job for b has nothing to do.
        j = self.job(b, "hb", "health", "finish", "--member", "b")
        self.assertEqual(j.wait(20), 75, j.stderr())
        self.assertIn("not-quarantined", j.stderr())
        self.assertEqual(self.running(b, "check-1", "health", exit_status=1), ["a"])
        self.queued(b, "check-2", "health", "--member", "a")
        # check-1 fails (exit 1): a stays quarantined and goes to check-2, not to the ordinary waiter.
        self.stop("check-1", 1)
        wait_for(lambda: self.w.started("check-2"), 10, message="check-2 to start")
        self.assertEqual(self.w.started("ordinary"), [])
        self.assertIn("a", self.quarantined(b))
        self.stop("other")
        # check-2's command exits 0: a is restored and goes to the ordinary waiter.
        self.stop("check-2")
        wait_for(lambda: self.w.started("ordinary"), 10, message="the ordinary waiter to get a")
        self.assertEqual(self.w.started("ordinary")[0].slots, ["a"])
        self.assertEqual(self.quarantined(b), {})
        self.stop("ordinary")
        metrics = b.call("io.slotbroker.Metrics")["text"]
        self.assertIn('slotbroker_member_quarantined{pool="rigs",member="a"} 0', metrics)

    def test_a_health_job_for_a_drained_quarantined_member_says_member_drained(self):
        b = self.rigs("drained-health")
        self.assertEqual(self.ran(b, "broken", "w", 3, "--member", "a"), ["a"])
        self.wait_quarantined(b, {"a"})
        p = self.slotctl(b, "drain", "rigs", "a", "--reason", "reflash")
        self.assertEqual(p.returncode, 0, p.stderr)
        j = self.job(b, "ha", "health", "finish", "--member", "a")
        self.assertEqual(j.wait(20), 75, j.stderr())
        self.assertIn("member-drained", j.stderr())
        self.assertNotIn("not-quarantined", j.stderr())
        self.assertEqual(self.w.started("ha"), [])

    def test_a_failed_health_check_keeps_the_member_quarantined(self):
        b = self.rigs("health-fails")
        self.ran(b, "broken", "w", 4, "--member", "b")
        self.wait_quarantined(b, {"b"})
        self.assertEqual(self.ran(b, "check", "health", 1), ["b"])
        self.assertEqual(set(self.quarantined(b)), {"b"})
        self.assertEqual(self.ran(b, "check-ok", "health", 0), ["b"])
        self.wait_quarantined(b, set())

    def test_other_statuses_and_no_status_quarantine_nothing(self):
        b = self.rigs("other", after=2)
        self.ran(b, "fails", "w", 1, "--member", "a")      # a test failure
        self.ran(b, "once", "w", 3, "--member", "a")       # one of two
        self.assertEqual(self.quarantined(b), {})
        self.ran(b, "ok", "w", 0, "--member", "a")         # breaks the run
        self.ran(b, "once-more", "w", 3, "--member", "a")
        self.assertEqual(self.quarantined(b), {})
        # slotctl's Release with the status comes right after its command's end: an end, not a revocation.
        events = b.call("io.slotbroker.History", {})["events"]
        self.assertEqual([e for e in events if e["decision"] in ("revoked", "overdue")], [])
        self.assertEqual(len([e for e in events if e["decision"] == "released"]), 4, events)
        # A client that releases without a status (an older slotctl) changes nothing.
        a = self.acquire(b, "w", member="a")
        lease = a.until_granted()["id"]
        b.call("io.slotbroker.Release", {"lease": lease})
        a.close()
        self.assertEqual(self.quarantined(b), {})
        # The second in a row does it.
        self.ran(b, "twice", "w", 4, "--member", "a")
        self.assertEqual(self.wait_quarantined(b, {"a"})["a"]["exitStatus"], 4)
        # An exit status out of range is refused, before anything changes.
        a = self.acquire(b, "w", member="b")
        lease = a.until_granted()["id"]
        for bad in (256, -1, "3", 3.5):
            with self.assertRaises(harness.VarlinkError) as e:
                b.call("io.slotbroker.Release", {"lease": lease, "exitStatus": bad})
            self.assertEqual(e.exception.parameters.get("parameter"), "exitStatus")
        self.assertEqual(b.pool("rigs")["inUse"], 1)
        a.close()

    def test_quarantine_and_restore_by_hand(self):
        b = self.rigs("by-hand")
        # Bad input: each a clear error, nothing changed.
        p = self.slotctl(b, "quarantine", "rigs", "a")
        self.assertEqual(p.returncode, EX_USAGE, p.stderr)
        self.assertIn("--reason", p.stderr)
        for reason, what in (("x" * (128 * 1024 - 1), "too long"), ("two\nlines", "control character"),
                             ("bell\a", "control character"), ("c1 \u0085", "control character"),
                             ("a\u2028b", "line break"), ("", "empty")):
            p = self.slotctl(b, "quarantine", "rigs", "a", "--reason", reason)
            self.assertEqual(p.returncode, EX_USAGE, p.stderr)
            self.assertIn(what, p.stderr)
        p = self.slotctl(b, "quarantine", "rigs", "zz", "--reason", "gone")
        self.assertEqual(p.returncode, EX_USAGE, p.stderr)
        self.assertIn('pool rigs has no member "zz"', p.stderr)
        p = self.slotctl(b, "quarantine", "nope", "a", "--reason", "gone")
        self.assertEqual(p.returncode, EX_USAGE, p.stderr)
        self.assertIn('no pool "nope"', p.stderr)
        p = self.slotctl(b, "quarantine", "anon", "0", "--reason", "gone")
        self.assertEqual(p.returncode, EX_USAGE, p.stderr)
        # Past slotctl: the broker's own checks.
        # C1 (U+0085 here) would make journalctl show the entry as "[blob data]"; U+2028 breaks the line.
        for params, parameter in (({"reason": "a\tb"}, "reason"), ({"reason": "x" * 1025}, "reason"),
                                  ({"reason": "next\u0085line"}, "reason"), ({"reason": "a\u2029b"}, "reason"),
                                  ({"reason": ""}, "reason"), ({}, "reason"), ({"reason": 7}, "reason")):
            with self.assertRaises(harness.VarlinkError) as e:
                b.call("io.slotbroker.Quarantine", {"pool": "rigs", "member": "a", **params})
            self.assertEqual(e.exception.parameters.get("parameter"), parameter)
        # A megabyte of reason is more than a message may be: the connection goes, brokerd stays, nothing changed.
        c = b.connect()
        try:
            c.send("io.slotbroker.Quarantine", {"pool": "rigs", "member": "a", "reason": "x" * 1000000})
        except OSError:
            pass  # closed while we were still sending
        c.wait_eof(timeout=10)
        c.close()
        self.assertEqual(self.quarantined(b), {})
        # A non-admin (nobody, not in admin-users=) is refused, and nothing changes.
        for method, params in (("io.slotbroker.Quarantine", {"reason": "mine now"}), ("io.slotbroker.Restore", {})):
            [msg] = harness.run_client_as(b.socket_path, method, {"pool": "rigs", "member": "a", **params})
            self.assertEqual(msg.get("error"), "io.slotbroker.PermissionDenied", msg)
            self.assertEqual(msg["parameters"].get("pool"), "rigs")
        # slotctl as nobody: exit 77, and says who may.
        p = subprocess.run([SLOTCTL, "quarantine", "--socket", b.socket_path, "rigs", "a", "--reason", "mine"],
                           capture_output=True, text=True, timeout=30, user=harness.NOBODY_UID,
                           group=harness.NOGROUP_GID, extra_groups=[], cwd="/")
        self.assertEqual(p.returncode, EX_NOPERM, p.stderr)
        self.assertIn("admin-users=", p.stderr)
        p = subprocess.run([SLOTCTL, "drain", "--socket", b.socket_path, "rigs", "a", "--reason", "mine"],
                           capture_output=True, text=True, timeout=30, user=harness.NOBODY_UID,
                           group=harness.NOGROUP_GID, extra_groups=[], cwd="/")
        self.assertEqual(p.returncode, EX_NOPERM, p.stderr)
        self.assertEqual(self.quarantined(b), {})
        self.assertNotIn("memberDrains", b.pool("rigs"))

        # Root quarantines a held member: its holder keeps it, nobody else gets it after.
        self.assertEqual(self.running(b, "holder", "w", "--member", "a"), ["a"])
        p = self.slotctl(b, "quarantine", "rigs", "a", "--reason", "flash worn: 93% of its erase cycles")
        self.assertEqual(p.returncode, 0, p.stderr)
        q = self.quarantined(b)["a"]
        self.assertEqual(q["reason"], "flash worn: 93% of its erase cycles")
        self.assertEqual(q["job"], f"uid {os.getuid()}")
        self.assertNotIn("exitStatus", q)
        self.assertRegex(self.slotctl(b, "status").stdout, r"a quarantined since .* by uid \d+: flash worn")
        self.queued(b, "next", "w", "--member", "a")
        self.stop("holder")
        self.assertEqual(self.w.started("next"), [])
        p = self.slotctl(b, "restore", "rigs", "a")
        self.assertEqual(p.returncode, 0, p.stderr)
        wait_for(lambda: self.w.started("next"), 10, message="next to get a")
        self.stop("next")
        self.assertEqual(self.quarantined(b), {})

    def test_admin_users_may_quarantine(self):
        b = self.rigs("admins", admin=str(harness.NOBODY_UID))
        [msg] = harness.run_client_as(b.socket_path, "io.slotbroker.Quarantine",
                                      {"pool": "rigs", "member": "b", "reason": "by nobody"})
        self.assertNotIn("error", msg)
        self.assertEqual(self.quarantined(b)["b"]["job"], f"uid {harness.NOBODY_UID}")
        [msg] = harness.run_client_as(b.socket_path, "io.slotbroker.Restore", {"pool": "rigs", "member": "b"})
        self.assertNotIn("error", msg)
        self.assertEqual(self.quarantined(b), {})

    def test_a_name_that_is_no_name_is_refused_before_it_reaches_the_journal(self):
        # A local user who administers nothing names a "pool" or "member" with a newline: before, [ADMIN_DENIED]
        # carried it into brokerd's log verbatim, a line of the user's own making ("[DRAINED] ..."), as a
        # denial of a pool that cannot exist. Now it is InvalidParameter, as Reserve already answered.
        b = self.rigs("no-names")
        forged = "\n[DRAINED] Pool rigs drained by uid 0: forged"
        for method, params, parameter in (
                ("io.slotbroker.Drain", {"pool": "rigs" + forged, "on": True}, "pool"),
                ("io.slotbroker.Drain", {"pool": "rigs", "member": "a" + forged, "on": True}, "member"),
                ("io.slotbroker.Drain", {"pool": "rigs", "member": "a" + forged, "on": False}, "member"),
                ("io.slotbroker.Quarantine", {"pool": "rigs" + forged, "member": "a", "reason": "r"}, "pool"),
                ("io.slotbroker.Quarantine", {"pool": "rigs", "member": "a" + forged, "reason": "r"}, "member"),
                ("io.slotbroker.Restore", {"pool": "rigs", "member": "a" + forged}, "member")):
            [msg] = harness.run_client_as(b.socket_path, method, params)
            self.assertEqual((msg.get("error"), msg.get("parameters")),
                             ("org.varlink.service.InvalidParameter", {"parameter": parameter}), (method, params))
        # A name that could be a pool's is still denied, and audited.
        [msg] = harness.run_client_as(b.socket_path, "io.slotbroker.Drain", {"pool": "nope", "on": True})
        self.assertEqual(msg.get("error"), "io.slotbroker.PermissionDenied", msg)
        wait_for(lambda: "[ADMIN_DENIED] uid 65534 may not drain pool nope" in b.log(), 10, message="the denial")
        self.assertNotIn("forged", b.log())
        self.assertNotIn("drainedMembers", b.pool("rigs"))
        self.assertFalse(b.pool("rigs")["drained"])

    def test_a_health_lane_with_an_access_list_restores_for_its_users_only(self):
        # A health job's exit 0 restores, as Restore does for admins only: brokerd.conf(5) tells operators to give
        # a health lane allow-users=/allow-groups=. Then nobody (not listed) is refused the lane and restores
        # nothing; without the list, anyone who reaches the socket could (the lane "health" of CONFIG).
        b = self.broker(CONFIG.format(after=1, admin="12345").replace("health = yes\n",
                                                                        "health = yes\nallow-users = 12345\n"), "acl")
        p = self.slotctl(b, "quarantine", "rigs", "a", "--reason", "broken")
        self.assertEqual(p.returncode, 0, p.stderr)
        [msg] = harness.run_client_as(b.socket_path, "io.slotbroker.Acquire", {"lane": "health", "member": "a"})
        self.assertEqual(msg.get("error"), "io.slotbroker.PermissionDenied", msg)
        self.assertEqual(set(self.quarantined(b)), {"a"})

    def test_shared_pools_take_quarantine_health_and_drain_reasons(self):
        # A shared pool whose Redis is not even there: the answer does not depend on it.
        try:
            b = self.broker("[pool shared]\nmembers = a b\nbackend = redis://127.0.0.1:1\n\n[lane s]\npools = shared\n",
                            "shared")
        except Exception as e:  # a brokerd built without Redis (-Dredis=disabled) takes no backend=
            self.skipTest(f"brokerd runs no shared pool here: {e}")
        # Quarantine is taken on shared pools (class Shared); a member it does not have is still a usage error.
        p = self.slotctl(b, "quarantine", "shared", "zz", "--reason", "broken")
        self.assertEqual(p.returncode, EX_USAGE, p.stderr)
        # Drains with a reason and an until are taken too (class Shared); an until that has passed is not.
        p = self.slotctl(b, "drain", "shared", "a", "--until", f"@{int(time.time()) - 60}")
        self.assertEqual(p.returncode, EX_USAGE, p.stderr)
        path = os.path.join(self.dir, "shared.conf")
        with open(path, "w") as f:
            f.write("[pool shared]\nmembers = a b\nbackend = redis://127.0.0.1:1\nquarantine-exit-codes = 3\n\n"
                    "[lane h]\npools = shared\nhealth = yes\n")
        p = subprocess.run([harness.find_brokerd(), "--check-config", "--config", path], capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr + p.stdout)  # quarantine-exit-codes and health taken
        self.assertNotRegex(p.stderr + p.stdout, rf"{re.escape(path)}:\d+: ")

    def test_a_set_counts_in_its_also_pool_for_quarantine_history_and_report(self):
        # SPEC §3.5/§3.6: one lease covers the set (lane e2e: pool grid, also= rigs), so its command's exit 3
        # quarantines the rig it held in rigs, by rigs' own codes; the history's rows of rigs name the rig, and
        # `slotctl report` counts its use, failures and quarantine as it does a lease of rigs alone.
        b = self.broker(CONFIG.format(after=1, admin="12345")
                        + "\n[pool grid]\nlimit = 1\n\n[lane e2e]\npools = grid\nalso = rigs\n", "set")
        def run_set(name, exit_status):
            j = harness.SlotctlRun(SLOTCTL, b.socket_path, "e2e",
                                   self.w.command(f"finish; exit {exit_status}", name, also=("rigs",)), "--job", name)
            self.addCleanup(j.kill)
            self.assertEqual(j.wait(20), exit_status, j.stderr())
            return {e.pool: e.slots for e in self.w.started(name)}

        self.assertEqual(run_set("e2e-1", 3), {"grid": ["0"], "rigs": ["a"]})
        q = self.wait_quarantined(b, {"a"})["a"]
        self.assertEqual((q["job"], q["exitStatus"]), ("e2e-1", 3))
        # Out of ordinary use: the next set gets b.
        self.assertEqual(run_set("e2e-2", 0), {"grid": ["0"], "rigs": ["b"]})
        events = b.call("io.slotbroker.History", {"pool": "rigs"})["events"]
        self.assertEqual([(e["decision"], e.get("member"), e.get("exitStatus")) for e in events
                          if e["decision"] in ("granted", "released", "quarantined")],
                         [("granted", "a", None), ("released", "a", 3), ("quarantined", "a", 3),
                          ("granted", "b", None), ("released", "b", 0)])
        self.assertEqual(self.report_members(b, "set"), {"a": ("1", "1", "1", "1"), "b": ("1", "1", "0", "0")})

    def test_check_config_refuses_bad_quarantine_keys(self):
        path = os.path.join(self.dir, "bad.conf")
        with open(path, "w") as f:
            f.write("[pool rigs]\nmembers = a b\nquarantine-exit-codes = 3 256\n\n[lane w]\npools = rigs\n")
        p = subprocess.run([harness.find_brokerd(), "--check-config", "--config", path], capture_output=True,
                           text=True, timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertRegex(p.stderr + p.stdout, rf"{re.escape(path)}:3: quarantine-exit-codes: .*256.*1 to 255")


class Drain(Base):
    """slotctl drain --reason --until (SPEC §3.6, issue 23 item 3), and what survives a restart (item 7)."""

    def test_drain_with_reason_and_until_undrains_by_itself(self):
        b = self.rigs("drain-until")
        now = int(time.time())
        # Bad input: a clear error, nothing drained.
        for args, what in ((("--until", f"@{now - 10}"), "passed"), (("--reason", "two\nlines"), "control"),
                           (("--until", "tomorrow-ish"), "invalid time")):
            p = self.slotctl(b, "drain", "rigs", "a", *args)
            self.assertEqual(p.returncode, EX_USAGE, p.stderr)
            self.assertIn(what, p.stderr)
        for params, parameter in (({"until": (now - 10) * 10**6}, "until"), ({"reason": "x\ty"}, "reason"),
                                  ({"reason": "x" * 1025}, "reason"), ({"on": False, "reason": "why"}, "reason")):
            with self.assertRaises(harness.VarlinkError) as e:
                b.call("io.slotbroker.Drain", {"pool": "rigs", "member": "a", "on": True, **params})
            self.assertEqual(e.exception.parameters.get("parameter"), parameter)
        self.assertNotIn("memberDrains", b.pool("rigs"))
        self.assertNotIn("drainedMembers", b.pool("rigs"))
        [msg] = harness.run_client_as(b.socket_path, "io.slotbroker.Drain", {"pool": "rigs", "member": "a", "on": True})
        self.assertEqual(msg.get("error"), "io.slotbroker.PermissionDenied", msg)

        until = now + 4
        p = self.slotctl(b, "drain", "rigs", "a", "--reason", "reflash", "--until", f"@{until}")
        self.assertEqual(p.returncode, 0, p.stderr)
        [d] = b.pool("rigs")["memberDrains"]
        self.assertEqual((d["member"], d["by"], d["reason"]), ("a", f"uid {os.getuid()}", "reflash"))
        # As given: not taken back from the monotonic deadline (a microsecond off, 09:59:59 for 10:00:00).
        self.assertEqual(d["until"], until * 10**6)
        self.assertRegex(self.slotctl(b, "status").stdout, r"a drained since .* by uid \d+ until .*: reflash")
        self.queued(b, "waiter", "w", "--member", "a")
        # It undrains by itself at `until`, and the waiter gets a.
        wait_for(lambda: self.w.started("waiter"), 15, message="the drain's end")
        self.assertGreaterEqual(time.time(), until - 0.05)
        self.stop("waiter")
        self.assertNotIn("memberDrains", b.pool("rigs"))
        # The history has who, why, since and until.
        def rows():
            got = [e for e in b.call("io.slotbroker.History", {})["events"] if e["decision"] in ("drained", "undrained")]
            return got if len(got) == 2 else None
        drained, undrained = wait_for(rows, 10, message="the drain in the history")
        self.assertEqual((drained["decision"], drained["pool"], drained.get("job"), drained.get("selector")),
                         ("drained", "rigs", f"uid {os.getuid()}", "@a"))
        # why and until, each in its own field (history.db schema 8), the until as it was given.
        self.assertEqual(drained.get("reason"), "reflash")
        self.assertEqual(drained["until"], until * 10**6)
        self.assertEqual((undrained["decision"], undrained.get("reason")), ("undrained", "reflash"))
        self.assertEqual(undrained["until"], until * 10**6)
        out = self.slotctl(b, "history", "--decision", "drained").stdout
        self.assertRegex(out, r"drained .* @a \(reflash\) until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d")

    def test_an_until_too_far_ahead_is_refused_and_members_state_stays_readable(self):
        # A pool's admin (not root) drains with an until the state file cannot hold: before, it was taken, written
        # to members.state as a negative number, and the next start found the file damaged: every drain and
        # quarantine of every pool was dropped, and nothing at all was granted until an operator stepped in.
        b = self.rigs("until-far", admin=str(harness.NOBODY_UID))
        p = self.slotctl(b, "quarantine", "rigs", "a", "--reason", "fan noise")
        self.assertEqual(p.returncode, 0, p.stderr)
        for until in (2**63 - 1, int(time.time() + 3651 * 86400) * 10**6):
            [msg] = harness.run_client_as(b.socket_path, "io.slotbroker.Drain",
                                          {"pool": "rigs", "member": "b", "on": True, "reason": "r", "until": until})
            self.assertEqual((msg.get("error"), msg.get("parameters")),
                             ("org.varlink.service.InvalidParameter", {"parameter": "until"}), msg)
        p = self.slotctl(b, "drain", "rigs", "b", "--until", "@9223372036853")
        self.assertEqual(p.returncode, EX_USAGE, p.stderr)
        self.assertIn("--until", p.stderr)
        self.assertNotIn("memberDrains", b.pool("rigs"))
        # As far ahead as a reservation may last is taken, and read back after a restart.
        until = int(time.time() + 3649 * 86400)
        p = self.slotctl(b, "drain", "rigs", "b", "--reason", "r", "--until", f"@{until}")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.start()
        self.assertNotIn("state.damaged", os.listdir(b.state_dir))
        self.assertIn("a", self.quarantined(b))
        [d] = b.pool("rigs")["memberDrains"]
        self.assertEqual(d["until"], until * 10**6)

    def test_a_drain_whose_until_came_while_brokerd_was_down_ends_in_the_history_and_the_journal(self):
        # As a lease that ended while brokerd was down ends in a history row: before, the drain's end was a
        # plain log line only, and `slotctl history --decision undrained` never showed it.
        # The until must come while brokerd is down: on a loaded machine (ASan, a CI's parallel runs) the drain
        # and the stop can take longer than its first margin, and the drain then ends while brokerd runs (the
        # other path, tested elsewhere): again with a fresh brokerd and a longer margin.
        for margin in (2, 5, 12):
            b = self.rigs(f"until-down-{margin}")
            until = int(time.time()) + margin
            p = self.slotctl(b, "drain", "rigs", "a", "--reason", "reflash", "--until", f"@{until}")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(b.stop(), 0, b.log()[-3000:])
            if time.time() < until - 0.1:
                break
        else:
            self.fail("the drain's until came before brokerd stopped, three times")
        wait_for(lambda: time.time() > until + 0.2, 15, message="the until to pass")
        b.start()
        self.assertNotIn("drainedMembers", b.pool("rigs"))

        def undrained():
            return [e for e in b.call("io.slotbroker.History", {})["events"] if e["decision"] == "undrained"]
        [row] = wait_for(undrained, 10, message="the undrain in the history")
        self.assertEqual((row["pool"], row.get("selector"), row.get("reason")), ("rigs", "@a", "reflash"))
        # As given (members.state keeps it so): CI once saw 1796582174999999 for …175000000 when it was taken
        # back from the monotonic deadline.
        self.assertEqual(row["until"], until * 10**6, row)
        self.assertIn("[UNDRAINED] Member a of pool rigs undrained (its --until came)", b.log())

    def test_a_waiter_for_a_member_whose_drain_ends_during_a_handover_gets_it(self):
        # A job waits for a, drained --until; the until comes while brokerd is down (a restart through the fd
        # store): the next brokerd ends the drain, takes the waiter back at its place, and grants it a.
        for margin in (2, 5, 12):
            b = self.broker(CONFIG.format(after=1, admin="12345"), f"until-handover-{margin}", mode="store")
            until = int(time.time()) + margin
            p = self.slotctl(b, "drain", "rigs", "a", "--reason", "reflash", "--until", f"@{until}")
            self.assertEqual(p.returncode, 0, p.stderr)
            waiter = self.queued(b, f"for-a-{margin}", "w", "--member", "a")
            self.assertEqual(b.stop(), 0, b.log()[-3000:])
            if time.time() < until - 0.1:
                break
            self.stop(f"for-a-{margin}")  # granted a before the stop: the drain ended while brokerd ran
        else:
            self.fail("the drain's until came before brokerd stopped, three times")
        wait_for(lambda: time.time() > until + 0.2, 15, message="the until to pass")
        b.start()
        name = f"for-a-{margin}"
        got = wait_for(lambda: self.w.started(name) or waiter.proc.poll() is not None, 10, message=f"{name} granted")
        self.assertIsNot(got, True, waiter.stderr())
        self.assertEqual(got[0].slots, ["a"])
        self.assertNotIn("queued again", waiter.stderr())
        self.stop(name)

    def test_drains_and_quarantines_survive_a_handover(self):
        # A restart through systemd's fd store (SPEC §3.4) reads members.state as any start does.
        b = self.broker(CONFIG.format(after=1, admin="12345"), "handover", mode="store")
        p = self.slotctl(b, "quarantine", "rigs", "a", "--reason", "fan noise")
        self.assertEqual(p.returncode, 0, p.stderr)
        p = self.slotctl(b, "drain", "rigs", "b", "--reason", "reflash", "--until", f"@{int(time.time()) + 600}")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.start()
        self.assertEqual(self.quarantined(b)["a"]["reason"], "fan noise")
        self.assertEqual(b.pool("rigs")["memberDrains"][0]["reason"], "reflash")
        text = self.slotctl(b, "history", "--decision", "drained").stdout
        self.assertRegex(text, r"drained .* @b \(reflash\) until 20")

    def test_a_quarantine_by_a_job_label_with_a_control_character_survives_a_restart(self):
        # Any user of a lane names its job: one whose label has a tab quarantines a (exit 3), one with an empty
        # label (a raw client) b, and pool anon is drained by hand. All are written to members.state and read
        # back by the next start as any others, never taken for damage (which would forget every drain and
        # quarantine, and grant nothing until an operator removed state.damaged).
        b = self.rigs("control-job")
        self.ran(b, "broken", "w", 3, "--member", "a", "--job", "broken\tjob")
        self.assertEqual(self.wait_quarantined(b, {"a"})["a"]["job"], "broken?job")
        a = self.acquire(b, "w", member="b", job="")
        b.call("io.slotbroker.Release", {"lease": a.until_granted()["id"], "exitStatus": 4})
        a.close()
        self.assertNotIn("job", self.wait_quarantined(b, {"a", "b"})["b"])
        p = self.slotctl(b, "drain", "anon", "--reason", "licence server moves")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.start()
        q = self.quarantined(b)
        self.assertEqual((q["a"]["job"], q["b"].get("job"), q["b"]["exitStatus"]), ("broken?job", None, 4))
        self.assertEqual(b.pool("anon")["drain"]["reason"], "licence server moves")
        self.assertNotIn("damaged", b.log())

    def test_drains_and_quarantines_survive_a_restart(self):
        b = self.rigs("restart")
        self.ran(b, "broken", "w", 3, "--member", "a")
        q = self.wait_quarantined(b, {"a"})["a"]
        until = int(time.time()) + 3600
        p = self.slotctl(b, "drain", "rigs", "b", "--reason", "new firmware", "--until", f"@{until}")
        self.assertEqual(p.returncode, 0, p.stderr)
        p = self.slotctl(b, "drain", "anon", "--reason", "licence server moves")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.start()
        q2 = self.quarantined(b)["a"]
        self.assertEqual((q2["job"], q2["exitStatus"]), ("broken", 3))
        self.assertLess(abs(q2["since"] - q["since"]), 2 * 10**6)
        [d] = b.pool("rigs")["memberDrains"]
        self.assertEqual((d["member"], d["reason"]), ("b", "new firmware"))
        self.assertEqual(d["until"], until * 10**6)
        self.assertEqual(b.pool("anon")["drain"]["reason"], "licence server moves")
        self.assertTrue(b.pool("anon")["drained"])
        # Obeyed, not only shown: nothing of rigs can be granted to an ordinary lane.
        p = subprocess.run([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "w", "--no-wait", "--", "true"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 75, p.stderr)
        # A reload keeps them too.
        b.reload()
        self.assertIn("a", self.quarantined(b))
        self.assertEqual(len(b.pool("rigs")["memberDrains"]), 1)
        # A damaged members.state is moved aside, never guessed at: brokerd starts without it, and, since which
        # members were drained or quarantined is not known, grants nothing new until an operator removes
        # state.damaged (SPEC §3.4). Before, the quarantined member "a" was granted again at once.
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        with open(os.path.join(b.state_dir, "members.state"), "w") as f:
            f.write('{"slotbroker":"members","version":1,"entries":[{"pool":"rigs","member":"../x","drain":{"since":1}}]}')
        b.start()
        self.assertEqual(self.quarantined(b), {})
        self.assertTrue(any(n.startswith("members.state.corrupt-") for n in os.listdir(b.state_dir)))
        self.assertIn("state.damaged", b.status().get("unavailable", ""))
        p = subprocess.run([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "w", "--no-wait", "--member", "a",
                            "--", "true"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 75, p.stderr)  # refused, not granted
        self.assertIn("unavailable", p.stderr)
        self.assertIn("storage", p.stderr)
        with open(os.path.join(b.state_dir, "state.damaged")) as f:
            self.assertIn("members.state is damaged", f.read())
        # What was carried over is not news: the history has one "drained" row per drain made, none per restart.
        rows = [e for e in b.call("io.slotbroker.History", {})["events"] if e["decision"] == "drained"]
        self.assertEqual(len(rows), 2, rows)
        self.assertIn("members.state is damaged", b.log())
        os.unlink(os.path.join(b.state_dir, "state.damaged"))
        wait_for(lambda: subprocess.run([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "w", "--no-wait",
                                         "--member", "a", "--", "true"], capture_output=True, timeout=30).returncode == 0,
                 10, interval=0.2, message="grants once state.damaged is removed")


    def test_member_counts_and_failures_in_a_row_survive_a_restart(self):
        # Issue 23 item 7: the per-member metrics and the count towards quarantine-after go on across a restart.
        b = self.rigs("counts-restart", after=2)
        self.ran(b, "fail-1", "w", 3, "--member", "a")  # one of two in a row
        self.ran(b, "ok-b", "w", 0, "--member", "b")
        self.assertEqual(self.quarantined(b), {})
        before = self.member_counts(b)
        self.assertEqual((before[("grants_total", "a")], before[("grants_total", "b")]), (1, 1))
        self.assertGreater(before[("held_seconds_total", "a")], 0)
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.start()
        self.assertEqual(self.member_counts(b), before)
        # The second failure in a row, after the restart, quarantines a.
        self.ran(b, "fail-2", "w", 3, "--member", "a")
        q = self.wait_quarantined(b, {"a"})["a"]
        self.assertEqual((q["job"], q["exitStatus"]), ("fail-2", 3))
        after = self.member_counts(b)
        self.assertEqual((after[("grants_total", "a")], after[("quarantines_total", "a")]), (2, 1))
        # A restart with the quarantine read again from members.state counts it once, not twice.
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.start()
        self.assertEqual(self.member_counts(b), after)
        # A reload that drops b and one that brings it back: b's counts come back with it (by name).
        config = CONFIG.format(after=2, admin="12345")
        b.write_config(config.replace("members = a b", "members = a"))
        b.reload()
        self.assertNotIn(("grants_total", "b"), self.member_counts(b))
        b.write_config(config)
        b.reload()
        self.assertEqual(self.member_counts(b), after)

    def test_member_counts_survive_a_handover_with_a_lease_held_across_it(self):
        # Through systemd's fd store (SPEC §3.4): the job on b runs across the restart and fails nothing; its
        # grant is counted once (the restored lease is not a second one), its hold when it ends.
        b = self.broker(CONFIG.format(after=1, admin="12345"), "counts-handover", mode="store")
        self.ran(b, "first", "w", 0, "--member", "a")
        self.running(b, "across", "w", "--member", "b")
        before = self.member_counts(b)
        self.assertEqual((before[("grants_total", "a")], before[("grants_total", "b")]), (1, 1))
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.start()
        self.assertEqual(self.member_counts(b), before)
        self.stop("across")
        after = wait_for(lambda: (lambda c: c if c[("held_seconds_total", "b")] > 0 else None)(self.member_counts(b)),
                         10, message="b's hold counted")
        self.assertEqual((after[("grants_total", "a")], after[("grants_total", "b")]), (1, 1))
        self.assertEqual(after[("held_seconds_total", "a")], before[("held_seconds_total", "a")])

    def test_a_lease_that_ends_while_brokerd_is_down_counts_its_held_time(self):
        # A reservation of a for 2 s (a detached lease) ends while brokerd is stopped: the next start finds it
        # ended and counts a's held time up to its end, its expiry (brokerd(8), "Restart"), not nothing.
        b = self.rigs("held-while-down")
        p = subprocess.run([SLOTCTL, "reserve", "--socket", b.socket_path, "rigs", "--member", "a", "--for", "2s",
                            "--reason", "bench"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        granted = time.time()
        before = self.member_counts(b)
        self.assertEqual((before[("grants_total", "a")], before[("held_seconds_total", "a")]), (1, 0))
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        wait_for(lambda: time.time() > granted + 3, 10, message="the reservation's end to pass")
        b.start()
        after = self.member_counts(b)
        self.assertEqual(after[("grants_total", "a")], 1)
        self.assertGreaterEqual(after[("held_seconds_total", "a")], 1.9)
        self.assertLessEqual(after[("held_seconds_total", "a")], 2.1)
        # Written as it is counted: a second restart keeps it.
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.start()
        self.assertEqual(self.member_counts(b), after)

    def test_a_job_that_ends_while_brokerd_is_down_counts_up_to_the_stop(self):
        # Its command exits while brokerd is stopped: nobody saw when, so its time counts up to the stop (the
        # alive mark a stop writes), never the downtime after it.
        b = self.rigs("job-while-down")
        self.running(b, "long", "w", "--member", "b")
        started = time.time()
        wait_for(lambda: time.time() > started + 1, 10, message="a second of the job")
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        stopped = time.time()
        self.w.stop("long")
        wait_for(lambda: time.time() > stopped + 2, 10, message="two seconds of downtime")
        b.start()
        held = self.member_counts(b)[("held_seconds_total", "b")]
        self.assertGreaterEqual(held, 0.9)
        self.assertLessEqual(held, stopped - started + 0.5)

    def test_a_health_also_lease_restored_after_a_restart_is_still_a_health_job(self):
        # health = also: its lease of a quarantined member is a health job's (its exit 0 restores); the lease log
        # keeps which it was, so a lease held across a restart ends as what it was granted as.
        config = CONFIG.format(after=1, admin="12345") + "\n[lane also]\npools = rigs\npolicy = wait\nhealth = also\n"
        b = self.broker(config, "health-also-restart", mode="store")
        self.ran(b, "broken", "w", 3, "--member", "a")
        self.wait_quarantined(b, {"a"})
        self.assertEqual(self.running(b, "check", "also"), ["a"])
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.start()
        self.stop("check", 0)
        self.wait_quarantined(b, set())

    def exit_during_handover(self, name, lane, exit_status, member):
        """Job `name` holds `member` of rigs across a handover and its command exits with exit_status while no
        brokerd runs: its Release with the status waits in the handed-over connection. Returns the broker."""
        b = self.broker(CONFIG.format(after=1, admin="12345"), name, mode="store")
        if lane == "health":
            p = self.slotctl(b, "quarantine", "rigs", member, "--reason", "fan noise")
            self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.running(b, name, lane, "--member", member, exit_status=exit_status), [member])
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        self.w.stop(name)
        wait_for(lambda: self.w.ended(name), 10, message=f"{name} to end while brokerd is down")
        b.start()
        self.assertEqual(self.jobs[name].wait(10), exit_status, self.jobs[name].stderr())
        self.assertNotIn("could not tell the broker", self.jobs[name].stderr())
        return b

    def test_an_exit_status_told_while_brokerd_restarts_quarantines(self):
        # SPEC §3.4/§3.6: a restart loses no job's word. The command exits 3 during the handover; its slotctl
        # tells the status on the connection the fd store kept: a is quarantined as if no restart had come.
        b = self.exit_during_handover("broken", "w", 3, "a")
        q = self.wait_quarantined(b, {"a"})
        self.assertEqual((q["a"]["job"], q["a"]["exitStatus"]), ("broken", 3))
        rows = {e["decision"]: e for e in b.call("io.slotbroker.History", {})["events"] if e.get("job") == "broken"}
        self.assertEqual(rows["released"].get("exitStatus"), 3)
        # Written as any quarantine: a crash and a start keep it.
        b.crash()
        b.start()
        self.assertEqual(set(self.quarantined(b)), {"a"})

    def test_a_health_job_that_passes_while_brokerd_restarts_restores(self):
        b = self.exit_during_handover("check", "health", 0, "a")
        self.wait_quarantined(b, set())

    def held_without_rigs(self, b, config, name, lane, exit_status, *options):
        """Job `name` (to exit with exit_status) holds a of rigs across a handover to a brokerd whose configuration
        has no pool rigs (nor its lanes): its lease is restored into a pool kept for it alone."""
        self.assertEqual(self.running(b, name, lane, *options, exit_status=exit_status), ["a"])
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.write_config(config[config.index("[pool anon]"):config.index("[lane w]")] + "[lane anon]\npools = anon\n")
        b.start()
        self.assertEqual([h["lease"]["members"] for h in b.status()["holders"]], [["a"]])

    def ended_without_rigs(self, b, config, name, lane, exit_status, *options):
        """held_without_rigs(), then the job exits there, then a reload brings config back. Returns rigs'
        quarantines then."""
        self.held_without_rigs(b, config, name, lane, exit_status, *options)
        self.stop(name, exit_status)
        wait_for(lambda: not b.status()["holders"], 10, message="the restored lease to end")
        b.write_config(config)
        b.reload()
        return self.quarantined(b)

    def test_an_exit_status_of_a_lease_restored_without_its_pool_quarantines_when_it_is_back(self):
        """A job holds a of rigs across a handover to a configuration without rigs (the pool removed, or moved to
        a backend, while brokerd was down), then exits 3: the pool kept for the restored lease alone was made
        without rigs' configuration, yet the job's exit quarantines a, as it would have had rigs stayed, as it
        does when a reload takes rigs away under the job (Shared). When rigs is back a stays out, also across a
        restart."""
        config = CONFIG.format(after=1, admin="12345")
        b = self.broker(config, "restored-away", mode="store")
        q = self.ended_without_rigs(b, config, "held", "w", 3, "--member", "a")
        self.assertEqual(set(q), {"a"})
        self.assertEqual((q["a"]["job"], q["a"]["exitStatus"]), ("held", 3))
        # The history names the member of the restored lease's release and of the quarantine it made.
        rows = {e["decision"]: e for e in b.call("io.slotbroker.History", {})["events"] if e.get("job") == "held"}
        self.assertEqual(rows["released"].get("member"), "a")
        self.assertEqual((rows["quarantined"].get("member"), rows["quarantined"].get("exitStatus")), ("a", 3))
        self.assertEqual(self.running(b, "next", "w"), ["b"])
        self.stop("next")
        b.crash()
        b.start()
        self.assertEqual(set(self.quarantined(b)), {"a"})

    def test_failures_in_a_row_go_on_in_a_lease_restored_without_its_pool(self):
        """quarantine-after = 2: a's first failure before a handover to a configuration without rigs, its second
        by the lease restored there (the lease log's count of a went on there): a is quarantined when rigs is
        back."""
        config = CONFIG.format(after=2, admin="12345")
        b = self.broker(config, "restored-after", mode="store")
        self.ran(b, "fail-1", "w", 3, "--member", "a")
        q = self.ended_without_rigs(b, config, "held", "w", 3, "--member", "a")
        self.assertEqual(set(q), {"a"})
        self.assertEqual((q["a"]["job"], q["a"]["exitStatus"]), ("held", 3))

    def test_a_health_job_restored_without_its_pool_restores_when_it_is_back(self):
        """The mirror: a health job holds the quarantined a across a handover to a configuration without rigs,
        then exits 0: a is restored, and does not come back quarantined with rigs."""
        config = CONFIG.format(after=1, admin="12345")
        b = self.broker(config, "restored-health", mode="store")
        p = self.slotctl(b, "quarantine", "rigs", "a", "--reason", "fan noise")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.ended_without_rigs(b, config, "check", "health", 0), {})
        self.assertEqual(self.running(b, "after", "w", "--member", "a"), ["a"])
        self.stop("after")

    def test_a_quarantine_keeps_its_who_and_why_when_its_pool_is_back_under_a_restored_health_job(self):
        """rigs comes back by reload while the health job restored without it still holds a: a is quarantined
        with the job and reason members.state kept, and the job's exit 0 restores it."""
        config = CONFIG.format(after=1, admin="12345")
        b = self.broker(config, "restored-health-back", mode="store")
        p = self.slotctl(b, "quarantine", "rigs", "a", "--reason", "fan noise")
        self.assertEqual(p.returncode, 0, p.stderr)
        since = self.quarantined(b)["a"]["since"]
        self.held_without_rigs(b, config, "check", "health", 0)
        b.write_config(config)
        b.reload()
        q = self.quarantined(b)["a"]
        self.assertEqual(q.get("reason"), "fan noise")
        self.assertLess(abs(q["since"] - since), 2 * 10**6)
        self.stop("check")
        self.wait_quarantined(b, set())

    def test_a_quarantine_older_than_the_boot_keeps_its_start(self):
        # SPEC §3.6: Status shows since when; a quarantine from before this boot is no younger for a reboot.
        b = self.rigs("old-quarantine")
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        boot = time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)
        since = int((boot - 7 * 86400) * 10**6)  # a week before the boot
        with open(os.path.join(b.state_dir, "members.state"), "w") as f:
            f.write('{"slotbroker":"members","version":1,"entries":[{"pool":"rigs","member":"a","quarantine":'
                    f'{{"since":{since},"job":"nightly-42","exitStatus":3}}}}]}}')
        b.start()
        self.assertEqual(self.quarantined(b)["a"]["since"], since)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since // 10**6))
        self.assertIn(f"a quarantined since {when} by job nightly-42 (exit 3)", self.slotctl(b, "status").stdout)
        # Written back as it was (members.state is rewritten after a start), so the next start still knows.
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.start()
        self.assertEqual(self.quarantined(b)["a"]["since"], since)


class Journal(Base):
    """[QUARANTINED], [RESTORED] and [ADMIN_DENIED] as journald has them (inside journald-ns.sh only)."""

    def setUp(self):
        journal_ns.require_private_journald()
        super().setUp()

    def entry(self, b, mid, **fields):
        def find():
            got = journal_ns.entries(f"MESSAGE_ID={mid}", f"_PID={b.pid}")
            return [e for e in got if all(e.get(k) == v for k, v in fields.items())]
        [e] = wait_for(find, 20, message=f"a journal entry {mid} {fields}")
        return e

    def test_entries_and_catalog(self):
        catalog = journal_ns.read_catalog(CATALOG)
        self.assertIn("[QUARANTINED]", catalog[MESSAGE_ID_QUARANTINED])
        self.assertIn("[RESTORED]", catalog[MESSAGE_ID_RESTORED])
        self.assertIn("[ADMIN_DENIED]", catalog[MESSAGE_ID_ADMIN_DENIED])
        b = self.rigs("journal")
        self.ran(b, "broken", "w", 3, "--member", "a")
        e = self.entry(b, MESSAGE_ID_QUARANTINED, SLOT_MEMBER="a")
        self.assertTrue(e["MESSAGE"].startswith("[QUARANTINED] Member a of pool rigs"), e["MESSAGE"])
        self.assertEqual((e["SLOT_POOL"], e["SLOT_JOB"], e["SLOT_EXIT_STATUS"]), ("rigs", "broken", "3"))
        self.ran(b, "check", "health", 0)
        e = self.entry(b, MESSAGE_ID_RESTORED, SLOT_MEMBER="a")
        self.assertTrue(e["MESSAGE"].startswith("[RESTORED]"), e["MESSAGE"])
        self.assertEqual((e["SLOT_JOB"], e["SLOT_EXIT_STATUS"]), ("check", "0"))
        p = self.slotctl(b, "quarantine", "rigs", "b", "--reason", "fan noise")
        self.assertEqual(p.returncode, 0, p.stderr)
        e = self.entry(b, MESSAGE_ID_QUARANTINED, SLOT_MEMBER="b")
        self.assertEqual((e["SLOT_REASON"], e["SLOT_JOB"]), ("fan noise", f"uid {os.getuid()}"))
        self.assertNotIn("SLOT_EXIT_STATUS", e)
        harness.run_client_as(b.socket_path, "io.slotbroker.Restore", {"pool": "rigs", "member": "b"})
        e = self.entry(b, MESSAGE_ID_ADMIN_DENIED, SLOT_MEMBER="b")
        self.assertEqual((e["SLOT_ACTION"], e["SLOT_CLIENT_UID"]), ("restore", str(harness.NOBODY_UID)))
        self.assertIn("b", self.quarantined(b))
        p = self.slotctl(b, "restore", "rigs", "b")
        self.assertEqual(p.returncode, 0, p.stderr)
        e = self.entry(b, MESSAGE_ID_RESTORED, SLOT_MEMBER="b")
        self.assertEqual(e["SLOT_JOB"], f"uid {os.getuid()}")  # who restored it
        self.assertNotIn("SLOT_EXIT_STATUS", e)
        self.assertIn(f"restored by uid {os.getuid()}", e["MESSAGE"])
        until = int(time.time()) + 2
        p = self.slotctl(b, "drain", "rigs", "a", "--reason", "reflash", "--until", f"@{until}")
        self.assertEqual(p.returncode, 0, p.stderr)
        e = self.entry(b, MESSAGE_ID_DRAINED, SLOT_MEMBER="a")
        self.assertEqual((e["SLOT_DECISION"], e["SLOT_REASON"], e["SLOT_JOB"]),
                         ("drained", "reflash", f"uid {os.getuid()}"))
        self.assertEqual(int(e["SLOT_UNTIL_USEC"]), until * 10**6)
        self.assertTrue(e["MESSAGE"].startswith("[DRAINED] Member a of pool rigs drained by uid"), e["MESSAGE"])
        e = self.entry(b, MESSAGE_ID_UNDRAINED, SLOT_MEMBER="a")
        self.assertIn("its --until came", e["MESSAGE"])
        self.assertIn("[DRAINED]", catalog[MESSAGE_ID_DRAINED])
        self.assertIn("[UNDRAINED]", catalog[MESSAGE_ID_UNDRAINED])


SHARED_CONFIG = """\
[broker]
node-name = {node}
revoke-grace = 1s

[pool rigs]
members = a b
backend = {backend}
backend-node-ttl = {ttl}s
quarantine-exit-codes = 3 4
quarantine-after = 1

[lane w]
pools = rigs
policy = wait

[lane health]
pools = rigs
policy = wait
health = yes

[lane also]
pools = rigs
policy = wait
health = also
"""
SHARED_TTL = 6  # seconds: a new pool's recovery window; revoke-grace 1s keeps it valid


class Shared(Base):
    """Quarantine on a pool shared through Redis (issue 23 item 7): two brokerds on one redis-server; the
    count and the quarantine live in Redis, every node shows and obeys them (brokerd/lua/README, "Members'
    lives")."""

    def setUp(self):
        import faults
        from redisd import RedisServer
        faults.skip_unless_shared_pools(self)
        super().setUp()
        self.redis = RedisServer(self.dir).start()
        self.addCleanup(self.redis.close)

    def node(self, name):
        b = self.broker(SHARED_CONFIG.format(node=name, backend=self.redis.url(), ttl=SHARED_TTL), name)
        wait_for(lambda: b.pool("rigs")["backend"]["up"], timeout=30, message=f"{name}: the backend up")
        return b

    def configs(self, name):
        """Node name's configuration with rigs shared, and the same with rigs local."""
        shared = SHARED_CONFIG.format(node=name, backend=self.redis.url(), ttl=SHARED_TTL)
        return shared, "".join(line for line in shared.splitlines(keepends=True) if not line.startswith("backend"))

    def move(self, b, config):
        """Reloads b with config; once its pool is shared, with the backend up."""
        b.write_config(config)
        b.reload()
        if "backend" in config:
            wait_for(lambda: b.pool("rigs")["backend"]["up"], timeout=30, message="the backend up")

    def ok(self, b, *args):
        """slotctl ARGS… on b, which must succeed."""
        p = self.slotctl(b, *args)
        self.assertEqual(p.returncode, 0, p.stderr)

    def node_b_draining_a(self):
        """Node B past the pool's recovery window (its first use waits it out), a drained in Redis by it."""
        b = self.node("node-b")
        j = self.job(b, "warm", "w", "finish")
        self.assertEqual(j.wait(SHARED_TTL + 30), 0, j.stderr())
        self.ok(b, "drain", "rigs", "a", "--reason", "broken")
        return b

    def test_an_exit_status_on_one_node_quarantines_for_every_node(self):
        a, b = self.node("node-a"), self.node("node-b")
        # The pool's first use waits out its recovery window (one TTL): a generous bound on the job.
        j = self.job(a, "broken", "w", "finish; exit 3")
        self.assertEqual(j.wait(SHARED_TTL + 30), 3, j.stderr())
        self.assertEqual(self.w.started("broken")[0].slots, ["a"])
        # Node B shows what node A's release did in Redis: since when, which job, which status, which node.
        q = self.wait_quarantined(b, {"a"})["a"]
        self.assertEqual((q["job"], q["exitStatus"], q["node"]), ("broken", 3, "node-a"))
        self.assertLess(abs(q["since"] / 1e6 - time.time()), 60)
        self.assertEqual(self.wait_quarantined(a, {"a"})["a"]["node"], "node-a")
        self.assertRegex(self.slotctl(b, "status").stdout, r"a quarantined since .* by job broken \(exit 3\)")
        metrics = b.call("io.slotbroker.Metrics")["text"]
        self.assertIn('slotbroker_member_quarantined{pool="rigs",member="a"} 1', metrics)
        self.assertIn('slotbroker_member_quarantined{pool="rigs",member="b"} 0', metrics)
        # And obeys it: B's first job gets b, its second waits (a is not granted to an ordinary lane).
        self.assertEqual(self.running(b, "other", "w"), ["b"])
        self.queued(b, "next", "w")
        self.queued(a, "next-a", "w")
        self.assertEqual((self.w.started("next"), self.w.started("next-a")), ([], []))
        # Bad input: an unknown member, no reason.
        p = self.slotctl(b, "quarantine", "rigs", "zz", "--reason", "gone")
        self.assertEqual(p.returncode, EX_USAGE, p.stderr)
        # Restored by hand on A: B's waiter (first in the pool's one queue) gets a.
        self.ok(a, "restore", "rigs", "a")
        wait_for(lambda: self.w.started("next"), 15, message="B's waiter to get a")
        self.assertEqual(self.w.started("next")[0].slots, ["a"])
        self.wait_quarantined(b, set())
        self.wait_quarantined(a, set())
        # A quarantine by hand on B: A's holder-to-be waits on, and A shows B's reason.
        self.ok(b, "quarantine", "rigs", "b", "--reason", "fan noise")
        q = self.wait_quarantined(a, {"b"})["b"]
        self.assertEqual((q["reason"], q["node"], q["job"]), ("fan noise", "node-b", f"uid {os.getuid()}"))
        self.assertNotIn("exitStatus", q)
        self.stop("other")
        self.assertEqual(self.w.started("next-a"), [])
        self.ok(b, "restore", "rigs", "b")
        wait_for(lambda: self.w.started("next-a"), 15, message="A's waiter to get b")
        self.stop("next")
        self.stop("next-a")

    def test_a_job_label_with_a_control_character_quarantines_as_any(self):
        # A job label is any text a client gives (--job, CI variables): one with a control character (here a tab
        # and an escape) is not one line of text. Its exit 3 quarantines the member for both nodes like any
        # other; what Status, the journal and Redis keep of the label is one line (the characters shown as
        # "?"), never a record that every node then reads as malformed input from Redis.
        a, b = self.node("node-a"), self.node("node-b")
        j = self.job(a, "broken", "w", "finish; exit 3", "--member", "a", "--job", "broken\tjob\x1b[1m")
        self.assertEqual(j.wait(SHARED_TTL + 30), 3, j.stderr())
        for n in (a, b):
            q = self.wait_quarantined(n, {"a"})["a"]
            self.assertEqual((q.get("job"), q["exitStatus"], q["node"]), ("broken?job?[1m", 3, "node-a"))
        for n in (a, b):
            self.assertNotIn("BACKEND_BAD_INPUT", n.log())

    def test_a_drain_until_on_one_node_ends_by_itself_for_both(self):
        a, b = self.node("node-a"), self.node("node-b")
        # The pool's first use waits out its recovery window.
        j = self.job(a, "warm", "w", "finish")
        self.assertEqual(j.wait(SHARED_TTL + 30), 0, j.stderr())
        until = int(time.time()) + 5
        self.ok(a, "drain", "rigs", "a", "--reason", "reflash", "--until", f"@{until}")

        def drain_of_a(node):
            return [d for d in node.pool("rigs").get("memberDrains", []) if d["member"] == "a"] or None
        d = wait_for(lambda: drain_of_a(b), 10, message="B to show A's drain")[0]
        self.assertEqual((d["by"], d["reason"]), (f"uid {os.getuid()}", "reflash"))
        self.assertLess(abs(d["until"] / 1e6 - until), 2)
        # B obeys it, and B's waiter gets a when the drain ends by itself (no node was told to undrain).
        self.assertEqual(self.running(b, "other", "w"), ["b"])
        self.queued(b, "next", "w")
        wait_for(lambda: self.w.started("next"), 30, message="B's waiter to get a at the drain's until")
        self.assertEqual(self.w.started("next")[0].slots, ["a"])
        self.assertGreater(time.time(), until - 1.5)
        wait_for(lambda: drain_of_a(a) is None and drain_of_a(b) is None, 10, message="the drain gone on both")
        self.stop("other")
        self.stop("next")

    def test_a_local_drain_does_not_undrain_the_shared_pool_it_moved_to(self):
        """Node A drains member a of rigs --until while rigs is local to A; a reload moves rigs to Redis, where
        node B has drained a (no until). A's old record must not end B's drain at its until: Redis's drain is
        the fleet's, and an undrain sent for A's record would give a to every node."""
        b = self.node_b_draining_a()
        shared, local = self.configs("node-a")
        a = self.broker(local, "node-a")
        until = int(time.time()) + 8
        self.ok(a, "drain", "rigs", "a", "--reason", "reflash", "--until", f"@{until}")
        self.ok(a, "drain", "rigs", "b", "--reason", "spare")
        self.move(a, shared)
        self.assertEqual(self.running(b, "other", "w"), ["b"])
        self.queued(b, "next", "w")
        time.sleep(max(0.0, until + 3 - time.time()))
        self.assertEqual(self.w.started("next"), [], "B's drain of a was ended by A's local record")
        self.ok(b, "undrain", "rigs", "a")
        wait_for(lambda: self.w.started("next"), 15, message="B's waiter to get a")
        self.assertEqual(self.w.started("next")[0].slots, ["a"])
        self.stop("other")
        self.stop("next")
        # A's local drain of b (no until) was not the fleet's; it holds again when rigs is local to A again.
        self.move(a, local)
        [d] = [d for d in a.pool("rigs").get("memberDrains", []) if d["member"] == "b"]
        self.assertEqual(d["reason"], "spare")

    def test_a_local_drain_does_not_undrain_the_shared_pool_a_lease_kept(self):
        """rigs goes local, shared, local and shared again on node A while A's job holds b in Redis: the shared
        pool object stays (retired) for that lease, and the last reload revives it rather than making one anew.
        A's drain of a (--until) and quarantine of b while rigs was local are not the fleet's, there too: Status
        does not show them as the shared pool's, the drain's until does not end B's drain of a in Redis, and
        both are A's again when rigs is local once more (the drain ended meanwhile)."""
        b = self.node_b_draining_a()
        shared, local = self.configs("node-a")
        a = self.broker(local, "node-a")
        self.move(a, shared)
        held = self.job(a, "held", "w", 'while [ ! -e "$d/stop-$n" ]; do sleep 0.02; done; finish')
        got = wait_for(lambda: self.w.started("held") or held.proc.poll() is not None, SHARED_TTL + 30,
                       message="A's job to get b in Redis")
        self.assertIsNot(got, True, held.stderr())
        self.assertEqual(got[0].slots, ["b"])
        self.move(a, local)
        until = int(time.time()) + 6
        self.ok(a, "drain", "rigs", "a", "--reason", "reflash", "--until", f"@{until}")
        self.ok(a, "quarantine", "rigs", "b", "--reason", "usb hub")
        self.move(a, shared)

        def drains(node):
            return sorted((d["member"], d["reason"]) for d in node.pool("rigs").get("memberDrains", []))
        self.assertEqual(drains(a), [("a", "broken")], "A shows its local drain as the shared pool's")
        self.assertEqual(self.quarantined(a), {})
        self.queued(b, "next", "w")
        time.sleep(max(0.0, until + 3 - time.time()))
        self.assertEqual(self.w.started("next"), [], "B's drain of a was ended by A's local record")
        self.assertEqual(drains(b), [("a", "broken")])
        self.stop("held")
        wait_for(lambda: self.w.started("next"), 15, message="B's waiter to get b")
        self.assertEqual(self.w.started("next")[0].slots, ["b"])
        self.stop("next")
        # Local once more: A's quarantine of b holds again, its drain of a ended at its until.
        self.move(a, local)
        self.assertEqual(set(self.quarantined(a)), {"b"})
        self.assertEqual(drains(a), [])
        self.assertEqual(self.running(a, "last", "w"), ["a"])
        self.stop("last")

    def test_local_drains_that_ended_while_the_pool_was_shared_do_not_hold_when_it_is_back(self):
        """A job on node A holds a of rigs while rigs is local; reloads move rigs to Redis and back: the local
        pool object stays (retired) for that lease, and the second reload revives it. A's drains of b and of the
        whole pool ended (--until) while rigs was shared: nobody drains anything now, and the revived pool must
        grant b. A drain without until holds again (brokerd.conf(5), "Moving a pool to or from Redis")."""
        shared, local = self.configs("node-a")
        a = self.broker(local, "node-a")
        self.assertEqual(self.running(a, "held", "w"), ["a"])
        until = int(time.time()) + 4
        for target in (["b"], []):
            self.ok(a, "drain", "rigs", *target, "--reason", "reflash", "--until", f"@{until}")
        self.move(a, shared)
        time.sleep(max(0.0, until + 2 - time.time()))
        self.move(a, local)
        status = a.pool("rigs")
        self.assertEqual((status["drained"], status.get("drainedMembers", [])), (False, []), status)
        self.assertEqual(self.running(a, "next", "w"), ["b"])
        self.stop("next")
        self.ok(a, "drain", "rigs", "b", "--reason", "spare")
        self.move(a, shared)
        self.move(a, local)
        self.assertEqual(a.pool("rigs").get("drainedMembers"), ["b"])
        self.queued(a, "again", "w")
        time.sleep(1)
        self.assertEqual(self.w.started("again"), [])
        self.ok(a, "undrain", "rigs", "b")
        wait_for(lambda: self.w.started("again"), 15, message="A's waiter to get b")
        self.assertEqual(self.w.started("again")[0].slots, ["b"])
        self.stop("again")
        self.stop("held")

    def test_a_quarantine_by_a_job_of_the_local_pool_a_move_left_holds_when_it_is_back(self):
        """A job on node A holds a of rigs while rigs is local; a reload moves rigs to Redis, and the job then
        exits 3 (quarantine-exit-codes): the local pool it held quarantines a as it goes with that last lease.
        A local quarantine is kept for a move back (brokerd.conf(5)), this one too: when rigs is local again a
        stays out, across a restart as well. A health job's exit 0 there restores it so too."""
        shared, local = self.configs("node-a")
        a = self.broker(local, "node-a")
        self.assertEqual(self.running(a, "held", "w", exit_status=3), ["a"])
        self.move(a, shared)
        self.stop("held", exit_status=3)
        self.move(a, local)
        self.assertEqual(set(self.quarantined(a)), {"a"})
        self.assertEqual(self.running(a, "next", "w"), ["b"])
        self.stop("next")
        a.crash()
        a.start()
        self.assertEqual(set(self.quarantined(a)), {"a"})
        # A health job's exit 0 restores a the same way: it does not come back with the pool.
        self.assertEqual(self.running(a, "check", "health"), ["a"])
        self.move(a, shared)
        self.stop("check")
        self.move(a, local)
        self.assertEqual(set(self.quarantined(a)), set())
        self.assertEqual(self.running(a, "after", "w"), ["a"])
        self.stop("after")

    def ended_in_the_pool_a_restart_moved(self, a, shared, local):
        """Restarts a with rigs moved to Redis (shared), its job "held" on a restored into a local pool made for
        it; ends that job with exit 3 there, then moves rigs back to local by reload."""
        self.assertEqual(a.stop(), 0, a.log()[-3000:])
        a.write_config(shared)
        a.start()
        self.assertEqual([h["lease"]["members"] for h in a.status()["holders"]], [["a"]])
        self.stop("held", exit_status=3)
        wait_for(lambda: not a.status()["holders"], 10, message="the restored lease to end")
        self.move(a, local)

    def test_a_quarantine_by_a_job_restored_into_the_local_pool_a_restart_moved_holds_when_it_is_back(self):
        """The same across a handover instead of a reload: a job on node A holds a of rigs while rigs is local;
        brokerd is restarted with rigs moved to Redis, and the lease is restored into a local pool made for it
        alone; the job's exit 3 there quarantines a for when rigs is local again."""
        shared, local = self.configs("node-a")
        a = self.broker(local, "node-a", mode="store")
        self.assertEqual(self.running(a, "held", "w", exit_status=3), ["a"])
        self.ended_in_the_pool_a_restart_moved(a, shared, local)
        self.assertEqual(set(self.quarantined(a)), {"a"})
        self.assertEqual(self.running(a, "next", "w"), ["b"])
        self.stop("next")

    def test_failures_in_a_row_go_on_in_a_lease_restored_into_the_local_pool_a_restart_moved(self):
        """quarantine-after = 2 across a restart that moved rigs to Redis: a's first failure while rigs is local,
        its second by a job restored into the local pool made for it. The lease log's counts of rigs's members
        are the local pool's: they go to that pool, not to the shared pool now configured under the name, and
        what that job's end counts is written back from there. a is quarantined when rigs is local again."""
        shared, local = (c.replace("quarantine-after = 1", "quarantine-after = 2") for c in self.configs("node-a"))
        a = self.broker(local, "node-a", mode="store")
        self.assertEqual(self.ran(a, "first", "w", 3, "--member", "a"), ["a"])
        self.assertEqual(self.quarantined(a), {})
        self.assertEqual(self.running(a, "held", "w", "--member", "a", exit_status=3), ["a"])
        self.ended_in_the_pool_a_restart_moved(a, shared, local)
        self.assertEqual(set(self.quarantined(a)), {"a"})

    def test_a_health_job_on_one_node_restores_for_both(self):
        a, b = self.node("node-a"), self.node("node-b")
        # Nothing quarantined: a health job has nothing to wait for (75: unavailable).
        j = self.job(b, "idle-check", "health", "finish")
        self.assertEqual(j.wait(SHARED_TTL + 30), 75, j.stderr())
        self.assertIn("not-quarantined", j.stderr())
        self.assertEqual(self.ran(a, "broken", "w", 4), ["a"])
        self.wait_quarantined(b, {"a"})
        self.assertEqual(self.running(a, "other", "w"), ["b"])
        self.queued(a, "ordinary", "w")
        # B's health job gets a past A's ordinary waiter; its exit 1 keeps a quarantined.
        self.assertEqual(self.ran(b, "check-1", "health", 1), ["a"])
        self.assertIn("a", self.quarantined(a))
        self.assertEqual(self.w.started("ordinary"), [])
        # Its exit 0 restores a for both nodes: A's waiter gets it.
        self.assertEqual(self.ran(b, "check-2", "health", 0), ["a"])
        wait_for(lambda: self.w.started("ordinary"), 15, message="A's waiter to get a")
        self.assertEqual(self.w.started("ordinary")[0].slots, ["a"])
        self.wait_quarantined(a, set())
        self.wait_quarantined(b, set())
        self.stop("other")
        self.stop("ordinary")

    def test_each_node_counts_its_own_use(self):
        # SPEC §3.6, usage per member: each node counts the leases it was granted (their grants and held seconds)
        # and the quarantines its own calls made; Prometheus sums the nodes. They go on across a restart (the
        # node's lease log), and `slotctl report` on the node's history has its table per member.
        a, b = self.node("node-a"), self.node("node-b")
        j = self.job(a, "broken", "w", "sleep 0.2; finish; exit 3", "--member", "a")
        self.assertEqual(j.wait(SHARED_TTL + 30), 3, j.stderr())
        self.assertEqual(self.ran(b, "fine", "w", 0, "--member", "b"), ["b"])
        self.wait_quarantined(b, {"a"})
        on_a = wait_for(lambda: (lambda c: c if c.get(("grants_total", "a")) else None)(self.member_counts(a)), 10,
                        message="A's counts")
        on_b = wait_for(lambda: (lambda c: c if c.get(("grants_total", "b")) else None)(self.member_counts(b)), 10,
                        message="B's counts")
        self.assertEqual((on_a[("grants_total", "a")], on_a[("grants_total", "b")]), (1, 0))
        self.assertEqual((on_b[("grants_total", "a")], on_b[("grants_total", "b")]), (0, 1))
        self.assertGreaterEqual(on_a[("held_seconds_total", "a")], 0.2)
        self.assertEqual(on_a[("held_seconds_total", "b")], 0)
        self.assertGreater(on_b[("held_seconds_total", "b")], 0)
        self.assertEqual(on_b[("held_seconds_total", "a")], 0)
        # A's release quarantined a: told to A alone, so the fleet's sum is 1, not one per node.
        self.assertEqual((on_a[("quarantines_total", "a")], on_b[("quarantines_total", "a")]), (1, 0))
        # A restart of A goes on from its lease log.
        self.assertEqual(a.stop(), 0, a.log()[-3000:])
        a.start()
        wait_for(lambda: a.pool("rigs")["backend"]["up"], timeout=30, message="A's backend up again")
        self.assertEqual(self.member_counts(a), on_a)
        # Its history: the report's table per member shows A's lease of a, its failure and its quarantine.
        self.assertEqual(self.report_members(a, "node-a"), {"a": ("1", "1", "1", "1")})

    def test_a_health_also_job_takes_the_quarantined_member_first(self):
        # health = also on a shared pool: the quarantined member first, though another is free; its exit 0
        # restores it for both nodes; with nothing quarantined, an ordinary member, as any lane's.
        a, b = self.node("node-a"), self.node("node-b")
        j = self.job(a, "broken", "w", "finish; exit 3", "--member", "b")
        self.assertEqual(j.wait(SHARED_TTL + 30), 3, j.stderr())
        self.wait_quarantined(b, {"b"})
        self.assertEqual(self.ran(b, "check", "also", 0), ["b"])
        self.wait_quarantined(a, set())
        self.wait_quarantined(b, set())
        self.assertEqual(self.ran(a, "ordinary", "also", 0), ["a"])

    def test_a_restart_reads_the_quarantine_back_from_redis(self):
        a = self.node("node-a")
        j = self.job(a, "broken", "w", "finish; exit 4")
        self.assertEqual(j.wait(SHARED_TTL + 30), 4, j.stderr())
        self.wait_quarantined(a, {"a"})
        self.stop_broker(a)
        a = self.node("node-a2")
        q = self.wait_quarantined(a, {"a"})["a"]
        self.assertEqual((q["job"], q["exitStatus"], q["node"]), ("broken", 4, "node-a"))


class SharedJournal(Base):
    """A shared pool's members' lives as journald has them (inside journald-ns.sh only): two brokerds on one
    redis-server, and each change journaled once fleet-wide, by the node whose call made it (brokerd/lua/README,
    "Members' lives", "Drains with a reason"), with its MESSAGE_ID and fields."""

    node = Shared.node  # (not a subclass: Shared's tests would run again here)

    def setUp(self):
        import faults
        from redisd import RedisServer
        journal_ns.require_private_journald()
        faults.skip_unless_shared_pools(self)
        super().setUp()
        self.redis = RedisServer(self.dir).start()
        self.addCleanup(self.redis.close)

    def entries(self, nodes, mid, **fields):
        got = [e for n in nodes for e in journal_ns.entries(f"MESSAGE_ID={mid}", f"_PID={n.pid}")]
        return [e for e in got if all(e.get(k) == v for k, v in fields.items())]

    def once(self, nodes, mid, **fields):
        """The one entry of the fleet; a second would be another node's journal of the same change."""
        wait_for(lambda: self.entries(nodes, mid, **fields), 20, message=f"a journal entry {mid} {fields}")
        return self.entries(nodes, mid, **fields)

    def test_quarantine_restore_and_drain_are_journaled_once_fleet_wide(self):
        a, b = self.node("node-a"), self.node("node-b")
        nodes = (a, b)
        j = self.job(a, "broken", "w", "finish; exit 3", "--member", "a")
        self.assertEqual(j.wait(SHARED_TTL + 30), 3, j.stderr())
        self.wait_quarantined(b, {"a"})
        # B's health job restores a: its release is B's call, A only reads the change back.
        self.assertEqual(self.ran(b, "check", "health", 0), ["a"])
        self.wait_quarantined(a, set())
        self.wait_quarantined(b, set())
        until = int(time.time()) + 3
        p = self.slotctl(a, "drain", "rigs", "b", "--reason", "reflash", "--until", f"@{until}")
        self.assertEqual(p.returncode, 0, p.stderr)
        # The drain's end by itself: whichever node's call ran the pool's instant at until journals it.
        [u] = self.once(nodes, MESSAGE_ID_UNDRAINED, SLOT_MEMBER="b")
        self.assertIn("its --until came", u["MESSAGE"])
        self.assertIn(u["_PID"], (str(a.pid), str(b.pid)))
        # Both nodes have answered calls since every change before (each showed the restore; the undrain came
        # after the drain): what is journaled by now is all there will be of them.
        [q] = self.entries(nodes, MESSAGE_ID_QUARANTINED, SLOT_MEMBER="a")
        self.assertEqual(q["_PID"], str(a.pid))
        self.assertTrue(q["MESSAGE"].startswith("[QUARANTINED] Member a of pool rigs"), q["MESSAGE"])
        self.assertEqual((q["SLOT_POOL"], q["SLOT_JOB"], q["SLOT_EXIT_STATUS"]), ("rigs", "broken", "3"))
        [r] = self.entries(nodes, MESSAGE_ID_RESTORED, SLOT_MEMBER="a")
        self.assertEqual(r["_PID"], str(b.pid))
        self.assertTrue(r["MESSAGE"].startswith("[RESTORED]"), r["MESSAGE"])
        self.assertEqual((r["SLOT_POOL"], r["SLOT_JOB"], r["SLOT_EXIT_STATUS"]), ("rigs", "check", "0"))
        [d] = self.entries(nodes, MESSAGE_ID_DRAINED, SLOT_MEMBER="b")
        self.assertEqual(d["_PID"], str(a.pid))
        self.assertEqual((d["SLOT_DECISION"], d["SLOT_REASON"], d["SLOT_JOB"]),
                         ("drained", "reflash", f"uid {os.getuid()}"))
        self.assertLess(abs(int(d["SLOT_UNTIL_USEC"]) - until * 10**6), 50000)
        self.assertEqual(u["SLOT_DECISION"], "undrained")
        self.assertEqual(u.get("SLOT_REASON"), "reflash")


if __name__ == "__main__":
    (_, SLOTCTL, CATALOG), argv = harness.arguments(__doc__, 3)
    harness.main(argv)
