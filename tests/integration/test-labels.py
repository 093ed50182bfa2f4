#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Labels and a named member through the real brokerd and `slotctl run` (SPEC §3.5, issue 22 items 1–3),
witnessed by the commands: each one creates a lock file per member it was given (witness.py), so a member
held twice, or a limit passed, fails the test from the commands' side.

Rigs a b c d: arm64 = a b, usb3 = b c, flaky = d.
- `--label arm64 --label usb3` gets b, `--label '!arm64' --label '!flaky'` gets c, `--member d` gets d;
  every granted member carries what was asked (SLOT_MEMBER).
- The history records what each grant asked for (History's selector).
- A selector no member can ever match exits 64 before it is queued: an unknown label or member, more
  members than carry the labels, a contradiction, a label that is not a label name, `labels=` of the lane
  narrowed into nothing.
- No barging per member: a two-rig arm64 waiter keeps the free arm64 rig set aside from a one-rig arm64
  request behind it, while a usb3 request takes c at once; when a frees, it gets a and b.
- Bad input past slotctl: label lists of the wrong type, too many, too long, a member that is no name;
  a megabyte of label closes the connection and nothing else.
- A labelled waiter handed over through the fd store keeps its labels: a free member it cannot use does
  not go to it after the restart.
- Bad input with a lease held and a waiter queued (issue 22 item 8): an unknown member, an empty label,
  10,000 labels, a label expression of 1 MB (within a max-message-size that lets it in) are each
  InvalidParameter as the first reply of a `more` call, nothing queued; through slotctl exit 64; the
  lease and the waiter are as they were, and the waiter still gets its members.
- bash completion completes --member with the members Status lists.

Usage: test-labels.py BROKERD SLOTCTL [unittest arguments]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
import harness  # noqa: E402
from harness import wait_for  # noqa: E402
from witness import Witness  # noqa: E402

SLOTCTL = None
EX_USAGE = 64
EX_TEMPFAIL = 75

CONFIG = """\
[broker]
reclaim-grace = 60s

[pool rigs]
members = a b c d
label.arm64 = a b
label.usb3 = b c
label.flaky = d

[lane w]
pools = rigs
policy = wait

[lane ff]
pools = rigs
policy = fail-fast

[lane arm]
pools = rigs
policy = wait
labels = arm64
"""

LABELS = {"a": {"arm64"}, "b": {"arm64", "usb3"}, "c": {"usb3"}, "d": {"flaky"}}


class Labels(harness.BrokerTestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="labels-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.w = Witness(self.dir)
        self.addCleanup(self.w.check, self)
        self.jobs = {}

    def job(self, b, name, lane, *options):
        j = harness.SlotctlRun(SLOTCTL, b.socket_path, lane, self.w.command_until_stopped(name), "--job", name,
                               *options)
        self.addCleanup(j.kill)
        self.jobs[name] = j
        return j

    def members(self, name):
        [start] = self.w.started(name) or [None]
        return start and start.slots

    def running(self, b, name, lane, *options):
        """A job that got its members and runs: returns them."""
        j = self.job(b, name, lane, *options)
        got = wait_for(lambda: self.members(name) or j.proc.poll() is not None, 10, message=f"{name} to start")
        self.assertIsNot(got, True, j.stderr())
        self.assertIsNone(j.proc.poll(), j.stderr())
        return got

    def queued(self, b, name, lane, *options):
        j = self.job(b, name, lane, *options)
        wait_for(lambda: "waiting for" in j.stderr() or j.proc.poll() is not None, 10, message=f"{name} queued")
        self.assertIsNone(j.proc.poll(), j.stderr())
        return j

    def end(self, b, name):
        self.w.stop(name)
        self.assertEqual(self.jobs[name].wait(10), 0, self.jobs[name].stderr())

    def refused_usage(self, b, *options):
        p = subprocess.run([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "w", *options, "--", "true"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, EX_USAGE, p.stderr)
        return p.stderr

    def assert_carries(self, members, *terms):
        for m in members:
            for t in terms:
                if t.startswith("!"):
                    self.assertNotIn(t[1:], LABELS[m], f"{m} carries {t[1:]}")
                else:
                    self.assertIn(t, LABELS[m], f"{m} does not carry {t}")

    def test_labels_and_member_choose_the_member(self):
        b = self.broker(CONFIG, "choose")
        self.assertEqual(self.running(b, "both", "w", "--label", "arm64", "--label", "usb3"), ["b"])
        self.assertEqual(self.running(b, "plain", "w", "--label", "!arm64", "--label", "!flaky"), ["c"])
        self.assertEqual(self.running(b, "named", "w", "--member", "d"), ["d"])
        self.assertEqual(self.running(b, "lane", "arm"), ["a"])  # the lane's own labels=
        s = b.status()
        self.assertEqual(s["pools"][0]["inUse"], 4)
        for name in ("both", "plain", "named", "lane"):
            self.end(b, name)
        # The history says what each asked for (the lane's own labels= are its configuration's).
        def selectors():
            got = {e["job"]: e.get("selector") for e in b.call("io.slotbroker.History", {})["events"]
                   if e["decision"] == "granted"}
            return got if len(got) == 4 else None
        self.assertEqual(wait_for(selectors, 10, message="the grants in the history"),
                         {"both": "arm64 usb3", "plain": "!arm64 !flaky", "named": "@d", "lane": None})

    def test_a_selector_nobody_matches_is_refused_before_queueing(self):
        b = self.broker(CONFIG, "refuse")
        self.assertIn("labels", self.refused_usage(b, "--label", "gpu"))
        self.assertIn("member", self.refused_usage(b, "--member", "z"))
        self.refused_usage(b, "--slots", "3", "--label", "arm64")
        self.refused_usage(b, "--label", "arm64", "--label", "!arm64")
        self.refused_usage(b, "--label", "Arm64")  # slotctl's own check
        self.refused_usage(b, "--label", "")
        # The lane's labels= (arm64) narrowed by the client into nothing.
        p = subprocess.run([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "arm", "--label", "!arm64", "--",
                            "true"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, EX_USAGE, p.stderr)
        # Straight through the protocol, past slotctl's checks.
        for params, parameter in (({"labels": ["a b"]}, "labels"), ({"labels": ["x"] * 33}, "labels"),
                                  ({"member": "../etc"}, "member"), ({"labels": "arm64"}, "labels"),
                                  ({"labels": ["x" * 10000]}, "labels")):
            with self.assertRaises(harness.VarlinkError) as e:
                b.call("io.slotbroker.Acquire", {"lane": "w", **params})
            self.assertEqual(e.exception.error, "org.varlink.service.InvalidParameter")
            self.assertEqual(e.exception.parameters.get("parameter"), parameter)
        # A megabyte of label is more than a message may be: the connection goes, brokerd stays.
        c = b.connect()
        try:
            c.send("io.slotbroker.Acquire", {"lane": "w", "labels": ["x" * 1000000]})
        except OSError:
            pass  # closed while we were still sending
        c.wait_eof(timeout=10)
        c.close()
        s = b.status()
        self.assertEqual(s["pools"][0]["waiting"], 0)
        self.assertEqual(s["pools"][0]["inUse"], 0)

    def test_no_barging_per_member(self):
        # One grant at a time (the witness checks that tokens grow in the order the commands start); the
        # engine's unit tests run the stream of one-rig requests.
        b = self.broker(CONFIG, "barging")
        self.assertEqual(self.running(b, "x", "w", "--member", "a"), ["a"])
        self.queued(b, "two", "w", "--slots", "2", "--label", "arm64")
        self.queued(b, "one", "w", "--label", "arm64")
        # c and d are no use to the arm64 waiters: they flow on.
        self.assertEqual(self.running(b, "usb", "ff", "--label", "usb3"), ["c"])
        self.assertEqual(self.running(b, "any", "ff", "--label", "!usb3"), ["d"])
        self.assertIsNone(self.members("one"), "b went past the two-rig waiter")
        # Status says what each waiter asks of the members: why it waits while b is free.
        waiters = {w["job"]: w for w in b.status()["waiters"]}
        self.assertEqual(waiters["two"].get("labels"), ["arm64"])
        self.assertNotIn("member", waiters["two"])
        text = subprocess.run([SLOTCTL, "status", "--socket", b.socket_path], capture_output=True, text=True).stdout
        self.assertRegex(text, r"two.*\(wants arm64\)")
        self.end(b, "x")
        got = wait_for(lambda: self.members("two"), 10, message="the two-rig waiter")
        self.assertEqual(sorted(got), ["a", "b"])
        self.assertIsNone(self.members("one"))
        self.end(b, "two")
        got = wait_for(lambda: self.members("one"), 10, message="the one-rig waiter")
        self.assert_carries(got, "arm64")
        for name in ("usb", "any", "one"):
            self.end(b, name)

    def test_status_shows_a_waiters_lane_labels(self):
        # A waiter of lane arm (labels = arm64) asks for arm64 without saying so: status names the lane's
        # labels too, or an operator sees it wait while c and d are free with no reason given.
        b = self.broker(CONFIG, "lanelabels")
        self.assertEqual(self.running(b, "x", "w", "--member", "a"), ["a"])
        self.assertEqual(self.running(b, "y", "w", "--member", "b"), ["b"])
        self.queued(b, "armjob", "arm", "--label", "!usb3")
        waiter = {w["job"]: w for w in b.status()["waiters"]}["armjob"]
        self.assertEqual(waiter.get("labels"), ["!usb3"])
        self.assertEqual(waiter.get("laneLabels"), ["arm64"])
        text = subprocess.run([SLOTCTL, "status", "--socket", b.socket_path], capture_output=True, text=True).stdout
        self.assertRegex(text, r"armjob.*\(wants !usb3 arm64\)")
        self.end(b, "x")
        self.assertEqual(wait_for(lambda: self.members("armjob"), 10, message="the arm64 waiter"), ["a"])
        for name in ("y", "armjob"):
            self.end(b, name)

    def test_labelled_waiter_keeps_its_labels_across_a_handover(self):
        b = self.broker(CONFIG, "handover", mode="store")
        for m in ("a", "b", "c"):
            self.running(b, f"h{m}", "w", "--member", m)
        self.queued(b, "arm", "w", "--label", "arm64")
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        self.assertEqual(b.store.names()[0], "sb-state")
        b.start()
        b.store.wait_for(lambda s: s.count() == 0, 10, "brokerd to flush the store")
        self.end(b, "hc")  # c is free: no use to the arm64 waiter
        self.assertEqual(self.running(b, "late", "ff", "--member", "c"), ["c"])
        self.assertIsNone(self.members("arm"))
        self.end(b, "ha")
        self.assertEqual(wait_for(lambda: self.members("arm"), 10, message="the arm64 waiter"), ["a"])
        self.assertNotIn("queued again", self.jobs["arm"].stderr())
        for name in ("hb", "late", "arm"):
            self.end(b, name)

    def test_reload_that_changes_a_lanes_labels_refuses_its_waiters(self):
        # Lane arm's labels= are every grant's: a waiter queued under arm64 is refused when they become usb3,
        # not granted a (arm64 only) once it frees; a w waiter, whose lane did not change, stays.
        b = self.broker(CONFIG, "relabel-lane")
        for m in "abcd":
            self.running(b, f"h{m}", "w", "--member", m)
        arm = self.queued(b, "arm", "arm")
        plain = self.queued(b, "plain", "w")
        b.write_config(CONFIG.replace("labels = arm64", "labels = usb3"))
        b.reload()
        self.assertEqual(arm.wait(10), EX_TEMPFAIL, arm.stderr())
        self.assertIn("reload", arm.stderr())
        self.assertIsNone(self.members("arm"))
        self.assertIsNone(plain.proc.poll(), plain.stderr())
        # A request made after the reload takes the new labels: a frees, plain gets it; b then goes to usb3.
        usb = self.queued(b, "usb", "arm")
        self.end(b, "ha")
        self.assertEqual(wait_for(lambda: self.members("plain"), 10, message="the w waiter"), ["a"])
        self.assertIsNone(self.members("usb"))
        self.end(b, "hb")
        self.assertEqual(wait_for(lambda: self.members("usb"), 10, message="the usb3 request"), ["b"])
        for name in ("hc", "hd", "plain", "usb"):
            self.end(b, name)

    def test_a_restart_that_changes_a_lanes_labels_refuses_its_waiters_as_a_reload_does(self):
        # An upgrade with a new brokerd.conf, through the fd store: lane arm's labels= become usb3 while its
        # waiter (queued under arm64) is handed over. As after a reload, it is refused, not granted c (usb3,
        # no arm64) by a rule it was not queued under; the w waiter, whose lane did not change, stays.
        b = self.broker(CONFIG, "relabel-restart", mode="store")
        for m in "abcd":
            self.running(b, f"h{m}", "w", "--member", m)
        arm = self.queued(b, "arm", "arm")
        plain = self.queued(b, "plain", "w")
        self.assertEqual(b.stop(), 0, b.log()[-3000:])
        b.write_config(CONFIG.replace("labels = arm64", "labels = usb3"))
        b.start()
        self.end(b, "hc")
        wait_for(lambda: arm.proc.poll() is not None or self.members("arm") or self.members("plain"), 10,
                 message="an answer")
        self.assertIsNone(self.members("arm"), "granted a member its lane's labels did not allow when it queued")
        self.assertEqual(arm.wait(10), EX_TEMPFAIL, arm.stderr())
        self.assertIn("reload", arm.stderr())
        self.assertEqual(wait_for(lambda: self.members("plain"), 10, message="the w waiter"), ["c"])
        for name in ("ha", "hb", "hd", "plain"):
            self.end(b, name)

    def test_bad_input_loses_nothing(self):
        b = self.broker(CONFIG.replace("reclaim-grace = 60s", "reclaim-grace = 60s\nmax-message-size = 2M"), "bad")
        self.assertEqual(self.running(b, "x", "w", "--member", "a"), ["a"])
        self.queued(b, "two", "w", "--slots", "2", "--label", "arm64")
        before = b.status()
        [lease] = [l["id"] for l in before["leases"]] if "leases" in before else [None]
        self.assertEqual((before["pools"][0]["inUse"], before["pools"][0]["waiting"]), (1, 1))

        megabyte = "x" * (1 << 20)
        for params, parameter in (({"member": "z"}, "member"), ({"labels": [""]}, "labels"),
                                  ({"labels": [f"l{i}" for i in range(10000)]}, "labels"),
                                  ({"labels": ["arm64"] * 10000}, "labels"),
                                  ({"labels": [megabyte]}, "labels"), ({"labels": ["!" + megabyte]}, "labels"),
                                  ({"member": megabyte}, "member")):
            with self.subTest(params=json.dumps(params)[:60]), b.connect() as c:
                c.send("io.slotbroker.Acquire", {"lane": "w", **params}, more=True)
                # The first reply is the refusal: never "queued", never granted.
                with self.assertRaises(harness.VarlinkError) as e:
                    c.reply(timeout=30)
                self.assertEqual(e.exception.error, "org.varlink.service.InvalidParameter")
                self.assertEqual(e.exception.parameters.get("parameter"), parameter)
        # slotctl's side: exit 64 before anything is sent or queued.
        self.refused_usage(b, "--member", "z")
        self.refused_usage(b, "--label", "")
        self.refused_usage(b, *[a for i in range(10000) for a in ("--label", f"l{i}")])
        self.refused_usage(b, "--label", "x" * 100000)

        after = b.status()
        self.assertEqual((after["pools"][0]["inUse"], after["pools"][0]["waiting"]), (1, 1))
        self.assertEqual([w["job"] for w in after["waiters"]], ["two"])
        if lease:
            self.assertEqual([l["id"] for l in after["leases"]], [lease])
        self.end(b, "x")
        self.assertEqual(sorted(wait_for(lambda: self.members("two"), 10, message="the two-rig waiter")), ["a", "b"])
        self.end(b, "two")

    def test_bash_completion_of_members(self):
        bash = shutil.which("bash")
        if not bash:
            self.skipTest("no bash")
        b = self.broker(CONFIG, "complete")
        completion = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "completions", "slotctl")
        script = ('source "$1"; COMP_WORDS=(slotctl run --socket "$2" --member "$3"); COMP_CWORD=5; '
                  '_init_completion() { return 1; }; unset -f _init_completion; _slotctl; '
                  'printf "%s\\n" "${COMPREPLY[@]}"')
        env = dict(os.environ, PATH=os.path.dirname(os.path.abspath(SLOTCTL)) + os.pathsep + os.environ["PATH"])
        for prefix, want in (("", ["a", "b", "c", "d"]), ("c", ["c"])):
            p = subprocess.run([bash, "-c", script, "bash", completion, b.socket_path, prefix], capture_output=True,
                               text=True, env=env, timeout=30)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(sorted(p.stdout.split()), want, p.stderr)


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
