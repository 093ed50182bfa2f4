#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Reservations for people through the real brokerd and slotctl (SPEC §3.6, issue 23 item 4), witnessed by the
commands (witness.py; the reservation takes its member's lock file itself while it holds it, so a member held by
the reservation and a job at once fails the test from the commands' side).

Rigs a b of pool rigs, lane w (wait):
- next in line: both rigs held by `slotctl run` jobs, two more jobs wait; `slotctl reserve rigs` says its
  position (1, ahead of both), takes the first rig that frees, prints its lease id and exits; the waiting jobs
  still wait. Status shows it: lane "@reserve", who (uid), the member, until when (expiresAt), why (its job).
  History records the reason. `slotctl release LEASE` ends it: the first waiting job gets the rig.
- it ends by itself after --for (max-hold), and the waiting job gets the member: after the release, in history's
  order and in time (brokerd ends it at an instant the test cannot give its lock file back at).
- --member and --label; a pool of anonymous slots takes its next slot; a reservation survives a restart, and a
  waiting one keeps its place across a handover through the fd store.
- who may: root and admin-users=; nobody is PermissionDenied (exit 77), audited, nothing queued.
- bad input, each a clear error (exit 64) with nothing changed: --for 0, negative, huge, missing; a reason
  missing, of 1 MB or with control characters; a member or labels no rig has; a pool that does not exist;
  --member or --label on a shared pool (not yet).

Usage: test-reserve.py BROKERD SLOTCTL [unittest arguments]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
import harness  # noqa: E402
from harness import wait_for  # noqa: E402
from witness import Witness  # noqa: E402

SLOTCTL = None
EX_USAGE = 64
EX_NOPERM = 77

CONFIG = """\
[pool rigs]
members = a b
label.fast = b
admin-users = {admin}

[pool anon]
limit = 1

[lane w]
pools = rigs
policy = wait

[lane anon]
pools = anon
policy = wait
"""


class Reserve(harness.BrokerTestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="reserve-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.w = Witness(self.dir)
        self.addCleanup(self.w.check, self)
        self.jobs = {}

    def rigs(self, name, admin="12345", **kw):
        return self.broker(CONFIG.format(admin=admin), name, **kw)

    def job(self, b, name, lane="w", *options):
        body = 'while [ ! -e "$d/stop-$n" ]; do sleep 0.02; done'
        j = harness.SlotctlRun(SLOTCTL, b.socket_path, lane, self.w.command(body, name), "--job", name, *options)
        self.addCleanup(j.kill)
        self.jobs[name] = j
        return j

    def running(self, b, name, *options):
        j = self.job(b, name, "w", *options)
        got = wait_for(lambda: self.w.started(name) or j.proc.poll() is not None, 10, message=f"{name} to start")
        self.assertIsNot(got, True, j.stderr())
        return got[0].slots

    def queued(self, b, name, *options):
        j = self.job(b, name, "w", *options)
        wait_for(lambda: "waiting for" in j.stderr() or j.proc.poll() is not None, 10, message=f"{name} queued")
        self.assertIsNone(j.proc.poll(), j.stderr())
        return j

    def stop(self, name):
        self.w.stop(name)
        self.assertEqual(self.jobs[name].wait(10), 0, self.jobs[name].stderr())

    def slotctl(self, b, *args, **kw):
        return subprocess.run([SLOTCTL, args[0], "--socket", b.socket_path, *args[1:]], capture_output=True,
                              text=True, timeout=30, **kw)

    def reserve(self, b, *args):
        """slotctl reserve in the background; its stderr in a file."""
        err = harness.StderrFile()
        self.addCleanup(err.close)
        p = subprocess.Popen([SLOTCTL, "reserve", "--socket", b.socket_path, *args], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=err, text=True)
        self.addCleanup(lambda: p.poll() is None and p.kill())

        def stderr():
            return err.read()
        p.stderr_text = stderr
        return p

    def waiting_reservation(self, b, *args):
        """slotctl reserve in the background, once it says it waits first in line (the only waiter)."""
        r = self.reserve(b, *args)
        wait_for(lambda: "position 1 of 1" in r.stderr_text() or r.poll() is not None, 10,
                 message="the reservation's position")
        self.assertIsNone(r.poll(), r.stderr_text())
        return r

    def hold(self, pool, member):
        """The reservation's lock file in the witness's books: taken as a command would (O_EXCL)."""
        d = os.path.join(self.dir, "held", pool)
        os.makedirs(d, exist_ok=True)
        fd = os.open(os.path.join(d, member), os.O_WRONLY | os.O_CREAT | os.O_EXCL)  # FileExistsError: held twice
        os.write(fd, f"reservation {os.getpid()}\n".encode())
        os.close(fd)

    def unhold(self, pool, member):
        os.unlink(os.path.join(self.dir, "held", pool, member))

    def holders(self, b, lane="@reserve"):
        return [h for h in b.status()["holders"] if h["lease"]["lane"] == lane]

    def test_next_in_line_ahead_of_waiting_jobs_then_release(self):
        b = self.rigs("next")
        self.assertEqual(self.running(b, "h1", "--member", "a"), ["a"])
        self.assertEqual(self.running(b, "h2", "--member", "b"), ["b"])
        self.queued(b, "q1")
        self.queued(b, "q2")
        r = self.reserve(b, "rigs", "--for", "1h", "--reason", "debugging the flaky USB hub")
        wait_for(lambda: "position 1 of 3" in r.stderr_text() or r.poll() is not None, 10,
                 message="the reservation's position")
        self.assertIsNone(r.poll(), r.stderr_text())
        self.assertIn("reservation waiting for pool rigs: position 1 of 3", r.stderr_text())
        waiters = [x for x in b.status()["waiters"] if x["pool"] == "rigs"]
        self.assertEqual([(x["lane"], x["position"]) for x in waiters], [("@reserve", 1), ("w", 2), ("w", 3)])

        # h2's rig frees first: the reservation takes it, not q1 who waited longer.
        self.stop("h2")
        out, _ = r.communicate(timeout=10)
        self.assertEqual(r.returncode, 0, r.stderr_text())
        lease = out.strip()
        self.assertRegex(lease, r"^[0-9a-f]{32}$")
        self.hold("rigs", "b")
        [h] = self.holders(b)
        self.assertEqual(h["lease"]["id"], lease)
        self.assertEqual(h["lease"]["members"], ["b"])
        self.assertEqual(h["lease"]["job"], "debugging the flaky USB hub")
        self.assertEqual(h["lease"]["uid"], os.getuid())
        self.assertLess(abs(h["lease"]["expiresAt"] / 1e6 - (time.time() + 3600)), 60)
        self.assertEqual(self.w.started("q1"), [])
        self.assertEqual(self.w.started("q2"), [])
        text = self.slotctl(b, "status").stdout
        self.assertRegex(text, rf"(?m)^  {lease} @reserve +b .* detached +debugging the flaky USB hub\n"
                               rf"    reserved by uid {os.getuid()} until \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d: "
                               r"debugging the flaky USB hub$")
        granted = [e for e in b.call("io.slotbroker.History", {})["events"]
                   if e["decision"] == "granted" and e.get("lane") == "@reserve"]
        self.assertEqual(len(granted), 1, granted)
        self.assertEqual(granted[0].get("job"), "debugging the flaky USB hub")

        # slotctl release ends it: q1, first of the jobs, gets b.
        self.unhold("rigs", "b")
        p = self.slotctl(b, "release", lease)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = wait_for(lambda: self.w.started("q1"), 10, message="q1 to get b")
        self.assertEqual(got[0].slots, ["b"])
        self.assertEqual(self.holders(b), [])
        for n in ("h1", "q1"):
            self.stop(n)
        wait_for(lambda: self.w.started("q2"), 10, message="q2 to start")
        self.stop("q2")

    def test_ends_after_for(self):
        b = self.rigs("for")
        r = self.reserve(b, "rigs", "--member", "a", "--for", "1s", "--reason", "reflash by hand")
        out, _ = r.communicate(timeout=10)
        self.assertEqual(r.returncode, 0, r.stderr_text())
        granted_at = time.monotonic()
        self.assertEqual(self.holders(b)[0]["lease"]["members"], ["a"])
        # The job for a waits until the reservation's hour... its second is over. brokerd ends the reservation
        # by itself, at an instant the test cannot take a's lock file back at: no lock file here; the order is
        # checked instead, in brokerd's history (the release's row before the grant's) and against the
        # command's own start (not before the release's time).
        j = self.queued(b, "after", "--member", "a")
        got = wait_for(lambda: self.w.started("after") or j.proc.poll() is not None, 10, message="after to start")
        self.assertIsNot(got, True, j.stderr())
        self.assertGreaterEqual(time.monotonic() - granted_at, 0.9)
        self.stop("after")
        events = b.call("io.slotbroker.History", {})["events"]
        ended = [e for e in events if e.get("lane") == "@reserve" and e["decision"] in ("revoked", "released")]
        granted = [e for e in events if e.get("job") == "after" and e["decision"] == "granted"]
        self.assertTrue(ended and granted, events)
        self.assertLess(max(e["id"] for e in ended), granted[0]["id"], events)
        self.assertGreaterEqual(self.w.start_time("after"), max(e["time"] for e in ended) / 1e6, events)

    def test_labels_anonymous_slots_and_a_restart(self):
        b = self.rigs("restart")
        r = self.reserve(b, "rigs", "--label", "fast", "--for", "1h", "--reason", "bisecting")
        out, _ = r.communicate(timeout=10)
        self.assertEqual(r.returncode, 0, r.stderr_text())
        lease = out.strip()
        self.hold("rigs", "b")
        self.assertEqual(self.holders(b)[0]["lease"]["members"], ["b"])
        # A pool of anonymous slots: the next slot.
        r = self.reserve(b, "anon", "--for", "1h", "--reason", "licence for a demo", "--json")
        out, _ = r.communicate(timeout=10)
        self.assertEqual(r.returncode, 0, r.stderr_text())
        self.assertEqual(json.loads(out)["pool"], "anon")
        # A restart keeps both (the lease log), with their reasons.
        self.assertEqual(b.stop(), 0)
        b.start()
        held = {h["lease"]["pool"]: h["lease"] for h in self.holders(b)}
        self.assertEqual(set(held), {"rigs", "anon"})
        self.assertEqual(held["rigs"]["id"], lease)
        self.assertEqual(held["rigs"]["job"], "bisecting")
        self.assertEqual(held["rigs"]["members"], ["b"])
        # ... and it still comes first: b stays reserved, a job for b waits; release gives it b.
        j = self.queued(b, "later", "--member", "b")
        self.unhold("rigs", "b")
        self.assertEqual(self.slotctl(b, "release", lease).returncode, 0)
        got = wait_for(lambda: self.w.started("later") or j.proc.poll() is not None, 10, message="later to start")
        self.assertIsNot(got, True, j.stderr())
        self.stop("later")

    def test_a_waiting_reservation_keeps_its_place_across_a_handover(self):
        b = self.rigs("handover", mode="store")
        self.assertEqual(self.running(b, "h1", "--member", "a"), ["a"])
        self.assertEqual(self.running(b, "h2", "--member", "b"), ["b"])
        self.queued(b, "q1")
        r = self.reserve(b, "rigs", "--for", "1h", "--reason", "across a handover")
        wait_for(lambda: "position 1 of 2" in r.stderr_text() or r.poll() is not None, 10,
                 message="the reservation's position")
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.start()
        b.store.wait_for(lambda s: s.count() == 0, 10, "brokerd to flush the store")
        waiters = [(x["lane"], x["position"], x.get("job")) for x in b.status()["waiters"]]
        self.assertEqual(waiters, [("@reserve", 1, "across a handover"), ("w", 2, "q1")])
        self.stop("h1")
        out, _ = r.communicate(timeout=10)
        self.assertEqual(r.returncode, 0, r.stderr_text())
        self.hold("rigs", "a")
        [h] = self.holders(b)
        self.assertEqual((h["lease"]["id"], h["lease"]["members"]), (out.strip(), ["a"]))
        self.assertEqual(self.w.started("q1"), [])
        self.unhold("rigs", "a")
        self.assertEqual(self.slotctl(b, "release", out.strip()).returncode, 0)
        got = wait_for(lambda: self.w.started("q1"), 10, message="q1 to get a")
        self.assertEqual(got[0].slots, ["a"])
        self.stop("h2")
        self.stop("q1")

    def test_a_waiting_reservation_is_refused_after_a_handover_that_took_its_makers_admin_away(self):
        """A reservation is checked against admin-users= again when the fd store hands it over, as a waiter's
        lane ACL is: a maker no longer the pool's admin is refused (exit 77, [ADMIN_DENIED]), nothing kept."""
        b = self.rigs("handover-admin", admin=str(harness.NOBODY_UID), mode="store")
        self.assertEqual(self.running(b, "h1", "--member", "a"), ["a"])
        self.assertEqual(self.running(b, "h2", "--member", "b"), ["b"])
        r = subprocess.Popen([SLOTCTL, "reserve", "--socket", b.socket_path, "rigs", "--for", "1h", "--reason", "mine"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, user=harness.NOBODY_UID,
                             group=harness.NOGROUP_GID, extra_groups=[], cwd="/")
        self.addCleanup(r.kill)
        wait_for(lambda: [x["lane"] for x in b.status()["waiters"]] == ["@reserve"] or r.poll() is not None, 10,
                 message="the reservation queued")
        self.assertIsNone(r.poll())
        b.write_config(CONFIG.format(admin="12345"))
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.start()
        _, err = r.communicate(timeout=10)
        self.assertEqual(r.returncode, EX_NOPERM, err)
        self.assertEqual(b.status()["waiters"], [])
        wait_for(lambda: f"[ADMIN_DENIED] uid {harness.NOBODY_UID} may not reserve pool rigs" in b.log(), 10,
                 message="the refusal in brokerd's journal")
        self.stop("h1")
        self.stop("h2")

    def test_who_may(self):
        b = self.rigs("who", admin=str(harness.NOBODY_UID + 1))
        p = subprocess.run([SLOTCTL, "reserve", "--socket", b.socket_path, "rigs", "--for", "1h", "--reason", "mine"],
                           capture_output=True, text=True, timeout=30, user=harness.NOBODY_UID,
                           group=harness.NOGROUP_GID, extra_groups=[], cwd="/")
        self.assertEqual(p.returncode, EX_NOPERM, p.stderr)
        self.assertIn("admin-users=", p.stderr)
        self.assertEqual(self.holders(b), [])
        self.assertEqual(b.status()["waiters"], [])
        wait_for(lambda: f"[ADMIN_DENIED] uid {harness.NOBODY_UID} may not reserve pool rigs" in b.log(), 10,
                 message="the refusal in brokerd's journal")
        # A member of admin-users= may.
        b2 = self.rigs("who-admin", admin=str(harness.NOBODY_UID))
        p = subprocess.run([SLOTCTL, "reserve", "--socket", b2.socket_path, "rigs", "--for", "1h", "--reason", "mine"],
                           capture_output=True, text=True, timeout=30, user=harness.NOBODY_UID,
                           group=harness.NOGROUP_GID, extra_groups=[], cwd="/")
        self.assertEqual(p.returncode, 0, p.stderr)
        [h] = self.holders(b2)
        self.assertEqual(h["lease"]["uid"], harness.NOBODY_UID)
        # Its owner may end it.
        p = subprocess.run([SLOTCTL, "release", "--socket", b2.socket_path, p.stdout.strip()], capture_output=True,
                           text=True, timeout=30, user=harness.NOBODY_UID, group=harness.NOGROUP_GID,
                           extra_groups=[], cwd="/")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.holders(b2), [])
        # So may another of the pool's admins (root's reservation, ended by nobody), but not someone else
        # (nobody, on the broker where it is no admin), nor an ordinary lease of another user.
        for broker, code in ((b, EX_NOPERM), (b2, 0)):
            lease = self.slotctl(broker, "reserve", "rigs", "--for", "1h", "--reason", "root's").stdout.strip()
            p = subprocess.run([SLOTCTL, "release", "--socket", broker.socket_path, lease], capture_output=True,
                               text=True, timeout=30, user=harness.NOBODY_UID, group=harness.NOGROUP_GID,
                               extra_groups=[], cwd="/")
            self.assertEqual(p.returncode, code, p.stderr)
            self.assertEqual(len(self.holders(broker)), 1 if code else 0)
            if code:
                self.assertIn("belongs to another user", p.stderr)
                self.assertEqual(self.slotctl(broker, "release", lease).returncode, 0)
            else:
                # Who ended another's reservation is audited: the history's row and the journal say so.
                def released():
                    return [e for e in broker.call("io.slotbroker.History", {})["events"]
                            if e.get("lease") == lease and e["decision"] == "released"]
                [row] = wait_for(released, 10, message="the release in the history")
                self.assertEqual((row["uid"], row.get("reason")), (0, f"by uid {harness.NOBODY_UID}"), row)
                wait_for(lambda: f"[LEASE_RELEASED] Lease {lease} of pool rigs (lane @reserve, job root's) released: "
                         f"by uid {harness.NOBODY_UID}" in broker.log(), 10, message="the release in the journal")
        lease = self.acquire(b2, "w", detach=True, maxHoldMs=60000).until_granted()["id"]
        p = subprocess.run([SLOTCTL, "release", "--socket", b2.socket_path, lease], capture_output=True,
                           text=True, timeout=30, user=harness.NOBODY_UID, group=harness.NOGROUP_GID,
                           extra_groups=[], cwd="/")
        self.assertEqual(p.returncode, EX_NOPERM, p.stderr)
        self.assertIn("belongs to another user", p.stderr)

    def test_bad_input(self):
        b = self.rigs("bad")
        cases = (
            (("rigs", "--for", "0", "--reason", "x"), "--for"),
            (("rigs", "--for", "-1s", "--reason", "x"), "--for"),
            (("rigs", "--for", "4000d", "--reason", "x"), "--for"),
            (("rigs", "--reason", "x"), "--for"),
            (("rigs", "--for", "1h"), "--reason"),
            (("rigs", "--for", "1h", "--reason", "x" * (128 * 1024 - 1)), "too long"),  # an argument's most
            (("rigs", "--for", "1h", "--reason", "two\nlines"), "control character"),
            (("rigs", "--for", "1h", "--reason", ""), "empty"),
            (("rigs", "--for", "1h", "--reason", "x", "--member", "zz"), "no member of that name"),
            (("rigs", "--for", "1h", "--reason", "x", "--label", "slow"), "no member with those labels"),
            (("rigs", "--for", "1h", "--reason", "x", "--member", "a", "--label", "fast"), "not both"),
            (("nope", "--for", "1h", "--reason", "x"), 'no pool "nope"'),
            (("rigs", "--for", "1h", "--reason", "x", "--lane", "w"), "lane"),
            (("--for", "1h", "--reason", "x"), "pool is missing"),
        )
        for args, what in cases:
            p = self.slotctl(b, "reserve", *args)
            self.assertEqual(p.returncode, EX_USAGE, (args[:6], p.stderr))
            self.assertIn(what, p.stderr, args[:6])
        # Past slotctl: the broker's own checks.
        for params, parameter in (({"forMs": 0}, "forMs"), ({"forMs": -5}, "forMs"),
                                  ({"forMs": 10**15}, "forMs"), ({"reason": "a\tb"}, "reason"),
                                  ({"reason": "x" * 1025}, "reason"), ({"member": "../x"}, "member"),
                                  ({"labels": ["a b"]}, "labels")):
            with self.assertRaises(harness.VarlinkError) as e:
                b.call("io.slotbroker.Reserve", {"pool": "rigs", "forMs": 1000, "reason": "ok", **params})
            self.assertEqual(e.exception.parameters.get("parameter"), parameter)
        # A megabyte of reason is more than a message may be: the connection goes, brokerd stays.
        c = b.connect()
        try:
            c.send("io.slotbroker.Reserve", {"pool": "rigs", "forMs": 1000, "reason": "x" * 1000000}, more=True)
        except OSError:
            pass  # closed while we were still sending
        c.wait_eof(timeout=10)
        c.close()
        self.assertEqual(self.holders(b), [])
        self.assertEqual(b.status()["waiters"], [])
        self.assertEqual(b.pool("rigs")["inUse"], 0)

    def test_a_reservation_is_journaled_at_the_default_audit_level(self):
        # SPEC §3.6: a reservation is audited, as a drain or a quarantine is, not only with audit = all: its grant
        # (who took which member, for what) and its end. brokerd here has no journald: what it would send, it
        # says on stderr. An ordinary grant stays routine.
        b = self.rigs("journaled")
        lease = self.acquire(b, "w", member="a").until_granted()["id"]
        p = self.slotctl(b, "reserve", "rigs", "--member", "b", "--for", "1h", "--reason", "reflash by hand")
        self.assertEqual(p.returncode, 0, p.stderr)
        reserved = p.stdout.strip()
        wait_for(lambda: f"[LEASE_GRANTED] Lease {reserved} of pool rigs (lane @reserve, job reflash by hand) granted"
                 in b.log(), 10, message="the reservation's grant in the journal")
        self.assertEqual(self.slotctl(b, "release", reserved).returncode, 0)
        wait_for(lambda: f"[LEASE_RELEASED] Lease {reserved} of pool rigs (lane @reserve, job reflash by hand) released"
                 in b.log(), 10, message="the reservation's end in the journal")
        self.assertNotIn(f"[LEASE_GRANTED] Lease {lease}", b.log())

    def test_a_user_at_max_waiters_per_uid_may_reserve_a_free_member_but_not_wait(self):
        # SPEC §10: queued requests per uid are limited; a reservation is one. Before, it waited past the limit
        # (max-waiters-per-uid = 0 too: "this user's requests never wait").
        b = self.broker("[broker]\nmax-waiters-per-uid = 1\n\n" + CONFIG.format(admin="12345"), "waiter-limit")
        self.assertEqual(self.running(b, "h1", "--member", "a"), ["a"])
        self.queued(b, "q1", "--member", "a")  # this uid's one waiter
        # b is free: taken at once, as an Acquire at the limit may take a free slot.
        p = self.slotctl(b, "reserve", "rigs", "--member", "b", "--for", "1h", "--reason", "free one")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.slotctl(b, "release", p.stdout.strip()).returncode, 0)
        # a is held: it would wait, one waiter too many.
        p = self.slotctl(b, "reserve", "rigs", "--member", "a", "--for", "1h", "--reason", "would wait")
        self.assertEqual(p.returncode, 75, p.stderr)
        self.assertIn("busy", p.stderr)
        self.assertEqual([x["lane"] for x in b.status()["waiters"]], ["w"])
        self.stop("h1")
        self.stop("q1")

    def test_a_refusal_exits_75_as_every_verb_s_does(self):
        # slotctl(1)'s one table: refused (unavailable) is 75, for a reservation as for run and acquire. Before,
        # slotctl reserve exited 1, as for an error of its own.
        b = self.rigs("refused")
        self.assertEqual(self.slotctl(b, "drain", "rigs", "--reason", "reflash").returncode, 0)
        p = self.slotctl(b, "reserve", "rigs", "--for", "1h", "--reason", "x")
        self.assertEqual(p.returncode, 75, p.stderr)
        self.assertIn("unavailable", p.stderr)
        self.assertEqual(self.slotctl(b, "undrain", "rigs").returncode, 0)
        # A waiting one, refused when its pool is drained under it.
        self.assertEqual(self.running(b, "h1", "--member", "a"), ["a"])
        self.assertEqual(self.running(b, "h2", "--member", "b"), ["b"])
        r = self.waiting_reservation(b, "rigs", "--for", "1h", "--reason", "waits")
        self.assertEqual(self.slotctl(b, "drain", "rigs", "--reason", "reflash").returncode, 0)
        r.communicate(timeout=10)
        self.assertEqual(r.returncode, 75, r.stderr_text())
        self.assertIn("drained", r.stderr_text())
        self.assertEqual(self.slotctl(b, "undrain", "rigs").returncode, 0)
        self.stop("h1")
        self.stop("h2")

    def test_a_reload_that_removes_the_member_it_waits_for_says_so(self):
        # A reservation (and a job) waiting for member a, which a reload removes: refused unavailable, as a
        # selector nothing can satisfy any more is. Before, the client and the journal said the pool was
        # drained, which it was not: an operator looked for a drain that nobody had made.
        b = self.member_removed("member-gone", "bound")
        wait_for(lambda: "Request of lane @reserve refused on pool rigs: a reload left the pool nothing" in b.log(), 10,
                 message="the refusal in the journal")
        self.assertNotIn("the pool is drained", b.log())
        self.assertFalse(b.pool("rigs")["drained"])  # a drain still says "drained": the test above

    def test_a_restart_that_removes_the_member_it_waits_for_says_so(self):
        # The same through a handover whose new brokerd.conf removes a: the waiters are refused as after a
        # reload (unavailable, "reload", exit 75), not as bad input (InvalidParameter "member", exit 64: a
        # CI job's own mistake, not retried), nor with a wait for ever or a drain.
        self.member_removed("member-gone-restart", "store")

    def member_removed(self, name, mode):
        """A reservation and a job wait for a, which the next configuration removes: by a reload (mode "bound"),
        or at a restart through the fd store ("store"). Both are refused as a reload refuses them."""
        b = self.rigs(name, mode=mode)
        self.assertEqual(self.running(b, "h1", "--member", "a"), ["a"])
        r = self.waiting_reservation(b, "rigs", "--member", "a", "--for", "1h", "--reason", "wants a")
        j = self.queued(b, "for-a", "--member", "a")
        if mode == "store":
            self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.write_config(CONFIG.format(admin="12345").replace("members = a b", "members = b c"))
        if mode == "store":
            b.start()
        else:
            self.assertEqual(self.slotctl(b, "reload").returncode, 0)
        r.communicate(timeout=10)
        self.assertEqual(r.returncode, 75, r.stderr_text())
        self.assertEqual(j.wait(10), 75, j.stderr())
        for err in (r.stderr_text(), j.stderr()):
            self.assertIn("pool rigs: reload", err)
            self.assertNotIn("drained", err)
            self.assertNotIn("queued again", err)
        self.assertFalse(self.w.started("for-a"))
        self.stop("h1")
        return b

    def test_shared_pools_check_a_member_against_their_rules(self):
        # A reservation on a shared pool is taken, for a member too (test-shared-cooldown.py); one for a member
        # the pool does not have is refused before anything reaches Redis (here none answers).
        try:
            b = self.broker("[pool shared]\nmembers = a b\nbackend = redis://127.0.0.1:1\n\n[lane s]\npools = shared\n",
                            "shared")
        except Exception as e:  # a brokerd built without Redis (-Dredis=disabled) takes no backend=
            self.skipTest(f"brokerd runs no shared pool here: {e}")
        p = self.slotctl(b, "reserve", "shared", "--for", "1h", "--reason", "x", "--member", "zz")
        self.assertEqual(p.returncode, EX_USAGE, p.stderr)
        self.assertIn("no member of that name", p.stderr)


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
