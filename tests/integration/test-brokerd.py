#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""brokerd end to end, against the real daemon: the Varlink conformance of the protocol, admission
(fail-fast, wait, SPEC §3.1's jammed example), leases (commands, max-hold, release, detach), reload,
drain, cancel, ACLs and sd_notify — the main scenarios once with the socket brokerd binds itself and once
through systemd-socket-activate.

Usage: test-brokerd.py BROKERD IO_SLOTBROKER_VARLINK [unittest arguments]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.dont_write_bytecode = True
import harness  # noqa: E402
from harness import (Broker, Child, VarlinkError, run_client_as, spawn_client_as,  # noqa: E402
                     read_json_line, wait_for, assert_on_time, LATENESS, NOBODY_UID, NOGROUP_GID)

VARLINK_FILE = None
MAX_HOLD_MS = 3650 * 24 * 3600 * 1000  # maxHoldMs's bound (io.slotbroker.varlink)

# One pool per scenario, so that the scenarios can share one broker without meeting.
CONFIG = """\
[broker]
audit = all
revoke-grace = 2s

# fail-fast, Q = 3s: Busy carries retryAfterSec in 1..3
[pool ff]
limit = 2
queue-timeout = 3s

[lane ff]
pools = ff
policy = fail-fast

# wait, Q = 1m: a waiter keeping up gets a budget of 60000 ms
[pool wq]
limit = 1
queue-timeout = 1m

[lane wq]
pools = wq
policy = wait

[lane wq-other]
pools = wq
policy = wait

# SPEC 3.1's jammed example scaled down: Q = 2s, fast threshold 1 s, saturated budget 1 s
[pool jam]
limit = 2
queue-timeout = 2s

[lane jam]
pools = jam
policy = wait

[pool cmd]
limit = 1

[lane cmd]
pools = cmd
policy = wait

[pool hold]
limit = 3

[lane hold]
pools = hold
policy = wait
max-hold = 1s

[pool rel]
limit = 1

[lane rel]
pools = rel
policy = wait

[pool det]
limit = 1

[lane det]
pools = det
policy = wait

[pool rig]
members = m1 m2
queue-timeout = 1m

[lane rig]
pools = rig
policy = wait

[pool acl]
limit = 4

[lane rootonly]
pools = acl
policy = fail-fast
allow-users = root

[lane groupok]
pools = acl
policy = fail-fast
allow-groups = root nogroup

[lane open]
pools = acl
policy = fail-fast
"""

# For the reload scenario: line numbers matter (errors must name file:line).
RELOAD_BASE = """\
[pool shrink]
limit = 2

[lane shrink]
pools = shrink
policy = wait
"""

RELOAD_GROWN = RELOAD_BASE.replace("limit = 2", "limit = 1") + """
[pool fresh]
limit = 1

[lane fresh]
pools = fresh
policy = fail-fast
"""

MAX_HOLD_CONFIG = """\
[pool hold]
limit = 1

[lane hold]
pools = hold
max-hold = 1s
"""

RELOAD_INVALID = RELOAD_GROWN + """
[lane broken]
pools = nosuchpool
policy = sometimes
"""


def lines_of(text, needle):
    """1-based line number of the first line containing needle."""
    for i, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(f"{needle!r} not in config")


class Scenarios:
    """The main scenarios; a subclass picks the mode (self-bound socket or socket activation)."""
    MODE = None
    broker = None

    @classmethod
    def setUpClass(cls):
        cls.broker = Broker(CONFIG, mode=cls.MODE, name="brokerd-main").start()

    @classmethod
    def tearDownClass(cls):
        if cls.broker and cls.broker.alive():
            cls.broker.stop()

    def setUp(self):
        if not self.broker.alive():
            # The test before killed it (and failed for it): start afresh rather than fail every test after.
            sys.stderr.write(f"\nbrokerd had died (status {self.broker.proc.returncode}); starting a new one\n")
            type(self).broker = Broker(CONFIG, mode=self.MODE, name="brokerd-main").start()

    def tearDown(self):
        # Every scenario cleans up after itself; nothing may be left held or waiting.
        self.doCleanups()
        self.broker.wait_idle(timeout=5)

    # ---- helpers ----

    @property
    def path(self):
        return self.broker.socket_path

    def acquire(self, lane, more=True, **params):
        a = self.broker.acquire(lane, more=more, **params)
        self.addCleanup(a.close)
        return a

    def hold(self, lane, **params):
        """A granted lease (Acquire with more), closed at cleanup."""
        a = self.acquire(lane, **params)
        self.assertTrue(a.granted, f"expected a grant on lane {lane}, got {a.msg}")
        self.assertTrue(a.continues, f"a grant with more must continue: {a.msg}")
        return a

    def queue(self, lane, **params):
        a = self.acquire(lane, **params)
        self.assertTrue(a.queued, f"expected to be queued on lane {lane}, got {a.msg}")
        self.assertTrue(a.continues, f"a queued reply must continue: {a.msg}")
        return a

    def tracked_acquire(self, lane, **params):
        """acquire() and the inode of brokerd's end of its connection."""
        a, inode = self.broker.tracked(lambda: self.broker.acquire(lane, **params))
        self.addCleanup(a.close)
        return a, inode

    def close_and_wait(self, a, inode):
        a.close()
        self.broker.wait_connection_gone(inode)

    def expect_error(self, fn, error, **params):
        with self.assertRaises(VarlinkError) as cm:
            fn()
        self.assertEqual(cm.exception.error, error, f"wrong error: {cm.exception}")
        for k, v in params.items():
            self.assertEqual(cm.exception.parameters.get(k), v, f"{error} parameter {k}: {cm.exception.parameters}")
        return cm.exception.parameters

    def call(self, method, params=None):
        return self.broker.call(method, params)

    def status(self):
        return self.broker.status()

    def holders(self, pool):
        return [h for h in self.status()["holders"] if h["lease"]["pool"] == pool]

    def waiters(self, pool):
        return [w for w in self.status()["waiters"] if w["pool"] == pool]

    # ---- org.varlink.service ----

    def test_get_info_names_the_service_and_both_interfaces(self):
        info = self.call("org.varlink.service.GetInfo")
        for key in ("vendor", "product", "version", "url"):
            self.assertIsInstance(info.get(key), str, f"GetInfo.{key} must be a string: {info}")
        self.assertEqual(sorted(info["interfaces"]), ["io.slotbroker", "org.varlink.service"])

    def test_interface_description_is_the_varlink_file_verbatim(self):
        with open(VARLINK_FILE, encoding="utf-8") as f:
            expected = f.read()
        d = self.call("org.varlink.service.GetInterfaceDescription", {"interface": "io.slotbroker"})
        self.assertEqual(d["description"], expected,
                         "GetInterfaceDescription(io.slotbroker) must serve io.slotbroker.varlink byte for byte")

    def test_service_interface_description_declares_the_standard_members(self):
        d = self.call("org.varlink.service.GetInterfaceDescription", {"interface": "org.varlink.service"})["description"]
        lines = [line.strip() for line in d.splitlines() if line.strip() and not line.startswith("#")]
        self.assertEqual(lines[0], "interface org.varlink.service")
        for member in ("method GetInfo()", "method GetInterfaceDescription(interface: string) -> (description: string)",
                       "error InterfaceNotFound (interface: string)", "error MethodNotFound (method: string)",
                       "error MethodNotImplemented (method: string)", "error InvalidParameter (parameter: string)"):
            self.assertIn(member, d, f"org.varlink.service description lacks {member!r}")

    def test_unknown_interface_description_is_interface_not_found(self):
        self.expect_error(lambda: self.call("org.varlink.service.GetInterfaceDescription", {"interface": "com.example.nope"}),
                          "org.varlink.service.InterfaceNotFound", interface="com.example.nope")

    def test_unknown_method_is_method_not_found(self):
        for method in ("io.slotbroker.Frobnicate", "org.varlink.service.Nope"):
            self.expect_error(lambda: self.call(method), "org.varlink.service.MethodNotFound", method=method)

    def test_unknown_interface_is_interface_not_found(self):
        self.expect_error(lambda: self.call("com.example.widgets.Spin"), "org.varlink.service.InterfaceNotFound",
                          interface="com.example.widgets")

    def test_bad_parameters_are_invalid_parameter_naming_the_parameter(self):
        A = "io.slotbroker.Acquire"
        cases = [
            (A, {}, "lane"),
            (A, {"lane": 5}, "lane"),
            (A, {"lane": None}, "lane"),
            (A, {"lane": "ff", "slots": "2"}, "slots"),
            (A, {"lane": "ff", "slots": 0}, "slots"),
            (A, {"lane": "ff", "slots": -1}, "slots"),
            (A, {"lane": "ff", "slots": 1.5}, "slots"),
            (A, {"lane": "ff", "slots": 2 ** 40}, "slots"),
            (A, {"lane": "ff", "slots": 3}, "slots"),  # more slots than any pool of the lane has
            (A, {"lane": "ff", "wait": "no"}, "wait"),
            (A, {"lane": "ff", "queueWaitMs": 0}, "queueWaitMs"),
            (A, {"lane": "ff", "queueWaitMs": -5}, "queueWaitMs"),
            (A, {"lane": "ff", "queueWaitMs": 2 ** 31}, "queueWaitMs"),
            (A, {"lane": "ff", "queueWaitMs": 10.0}, "queueWaitMs"),
            (A, {"lane": "ff", "job": 7}, "job"),
            (A, {"lane": "ff", "job": "x" * 5000}, "job"),
            (A, {"lane": "ff", "pid": "1"}, "pid"),
            (A, {"lane": "ff", "pid": 0}, "pid"),
            (A, {"lane": "ff", "pid": -1}, "pid"),
            (A, {"lane": "ff", "maxHoldMs": 0}, "maxHoldMs"),
            (A, {"lane": "ff", "maxHoldMs": 9223372036854775}, "maxHoldMs"),  # its expiresAt overflowed
            (A, {"lane": "ff", "maxHoldMs": MAX_HOLD_MS + 1}, "maxHoldMs"),
            (A, {"lane": "ff", "detach": "yes"}, "detach"),
            (A, {"lane": "ff", "detach": True}, "maxHoldMs"),  # a detached lease needs an end of its own
            (A, {"lane": "ff", "frobnicate": 1}, "frobnicate"),
            ("io.slotbroker.Release", {}, "lease"),
            ("io.slotbroker.Release", {"lease": 5}, "lease"),
            ("io.slotbroker.Release", {"lease": "x", "force": True}, "force"),
            ("io.slotbroker.Status", {"verbose": True}, "verbose"),
            ("io.slotbroker.Drain", {"pool": "rig"}, "on"),
            ("io.slotbroker.Drain", {"pool": "rig", "on": "yes"}, "on"),
            ("io.slotbroker.Cancel", {"uid": -1}, "uid"),
            ("io.slotbroker.Cancel", {"uid": "0"}, "uid"),
            ("io.slotbroker.Reload", {"now": True}, "now"),
            ("org.varlink.service.GetInterfaceDescription", {}, "interface"),
            ("org.varlink.service.GetInfo", {"x": 1}, "x"),
        ]
        with self.broker.connect() as c:  # errors leave the connection usable: one connection for all
            for method, params, parameter in cases:
                with self.subTest(method=method, params=params):
                    c.send(method, params, more=method == A)
                    msg = c.recv()
                    self.assertEqual(msg.get("error"), "org.varlink.service.InvalidParameter",
                                     f"{method}({json.dumps(params)[:80]}) should be InvalidParameter: {msg}")
                    self.assertEqual(msg["parameters"].get("parameter"), parameter,
                                     f"{method}({json.dumps(params)[:80]}) names the wrong parameter: {msg}")
            c.call("org.varlink.service.GetInfo")
        self.assertEqual(self.broker.pool("ff")["inUse"], 0, "a refused call must change nothing")

    def test_oneway_acquire_is_invalid_parameter(self):
        with self.broker.connect() as c:
            c.send("io.slotbroker.Acquire", {"lane": "ff"}, oneway=True)
            msg = c.recv()
            self.assertEqual(msg.get("error"), "org.varlink.service.InvalidParameter", f"oneway Acquire: {msg}")
        self.assertEqual(self.holders("ff"), [], "a oneway Acquire must not create a lease")

    def test_oneway_call_gets_no_reply(self):
        with self.broker.connect() as c:
            c.send("io.slotbroker.Status", oneway=True)
            c.send("org.varlink.service.GetInfo")
            # Replies come in order: the first reply is GetInfo's if the oneway call got none.
            params, _ = c.reply()
            self.assertIn("interfaces", params, f"a oneway call was answered: {params}")

    def test_unknown_lane_is_no_such_lane(self):
        a = self.acquire("nosuchlane")
        self.assertEqual(a.error, "io.slotbroker.NoSuchLane", a.msg)
        self.assertEqual(a.params.get("lane"), "nosuchlane")

    # ---- admission ----

    def test_fail_fast_grants_while_there_is_room_then_busy(self):
        a1, a2 = self.hold("ff", job="first"), self.hold("ff", job="second")
        l1, l2 = a1.lease, a2.lease
        self.assertEqual(sorted(l1["slots"] + l2["slots"]), [0, 1], "two grants must hold the two distinct slots")
        self.assertLess(l1["token"], l2["token"], "fencing tokens must increase")
        self.assertEqual((l1["pool"], l1["lane"], l1["job"], l1["uid"], l1["pid"], l1["detached"]),
                         ("ff", "ff", "first", os.getuid(), os.getpid(), False))
        self.assertNotEqual(l1["id"], l2["id"])
        self.assertGreaterEqual(len(l1["id"]), 16, "lease ids must be unguessable")
        self.assertIsNone(l1.get("expiresAt"), "no max-hold, no expiry")
        now_us = time.time() * 1e6
        self.assertLess(abs(l1["grantedAt"] - now_us), 5e6, f"grantedAt is realtime µs: {l1['grantedAt']}")
        seen = set()
        for _ in range(20):  # retryAfterSec is random in [1, ⌈Q⌉] = [1, 3]
            b = self.acquire("ff")
            self.assertEqual(b.error, "io.slotbroker.Busy", f"a full fail-fast pool must refuse at once: {b.msg}")
            self.assertEqual(b.params.get("pool"), "ff")
            r = b.params.get("retryAfterSec")
            self.assertIsInstance(r, int)
            self.assertTrue(1 <= r <= 3, f"retryAfterSec {r} outside [1, 3] for Q = 3s")
            seen.add(r)
            b.close()
        self.assertGreater(len(seen), 1, f"retryAfterSec must be random, always got {seen}")
        p = self.broker.pool("ff")
        self.assertEqual((p["limit"], p["inUse"], p["waiting"]), (2, 2, 0))
        # Closing a holder frees its slot: the next request gets exactly that slot.
        freed = l1["slots"]
        a1.close()
        wait_for(lambda: self.broker.pool("ff")["inUse"] == 1, message="pool ff to show 1 in use")
        a3 = self.hold("ff")
        self.assertEqual(a3.lease["slots"], freed)
        self.assertGreater(a3.lease["token"], l2["token"])

    def test_wait_lane_queues_then_grants_when_the_holder_closes(self):
        h, inode = self.tracked_acquire("wq", job="holder")
        self.assertTrue(h.granted, h.msg)
        w = self.queue("wq", job="waiter")
        self.assertEqual({k: w.params.get(k) for k in ("state", "pool", "position", "queued", "budgetMs")},
                         {"state": "queued", "pool": "wq", "position": 1, "queued": 1, "budgetMs": 60000})
        [st] = self.waiters("wq")
        self.assertEqual((st["position"], st["lane"], st["slots"], st["job"], st["uid"], st["pid"], st["budgetMs"]),
                         (1, "wq", 1, "waiter", os.getuid(), os.getpid(), 60000))
        self.assertGreaterEqual(st["waitedMs"], 0)
        t0 = time.monotonic()
        h.close()
        w.until_granted(timeout=LATENESS + 1)
        assert_on_time(time.monotonic() - t0, 0, "a freed slot must go to the waiter at once: granted")
        self.assertTrue(w.continues)
        self.assertEqual(w.lease["slots"], [0])
        self.assertEqual(self.waiters("wq"), [])

    def test_first_queued_reply_comes_before_whatever_ends_the_wait(self):
        """A waiter's first "queued" reply may wait a moment to leave with what follows (brokerd's
        QUEUED_NOTICE_GRACE): however soon the wait ends, the client gets it, first. A refusal at the 1 ms
        cap races the grace; a grant, the holder's close read just after the Acquire (or just before: then
        no wait at all)."""
        for i in range(10):
            h = self.hold("wq", job="holder")
            q = self.acquire("wq", job=f"capped{i}", queueWaitMs=1)
            self.assertEqual({k: q.params.get(k) for k in ("state", "position", "queued", "budgetMs")},
                             {"state": "queued", "position": 1, "queued": 1, "budgetMs": 1}, q.msg)
            q.until(lambda a: a.error, timeout=LATENESS + 1, what="the QueueTimeout")
            self.assertEqual((q.error, len(q.replies)), ("io.slotbroker.QueueTimeout", 2), q.replies)
            conn = harness.Varlink(self.path)
            self.addCleanup(conn.close)
            conn.send("io.slotbroker.Acquire", {"lane": "wq", "job": f"waiter{i}"}, more=True)
            h.close()
            w = harness.Acquisition(conn, conn.recv())
            w.until_granted(timeout=LATENESS + 1)
            states = [m["parameters"]["state"] for m in w.replies]
            self.assertIn(states, (["queued", "granted"], ["granted"]), w.replies)
            self.assertIsNone(conn.poll(0.05), "nothing after the grant")
            conn.close()
            wait_for(lambda: self.broker.pool("wq")["inUse"] == 0, message="pool wq free again")

    def test_status_waiter_reports_budget_state(self):
        self.hold("wq")
        self.queue("wq")
        [st] = self.waiters("wq")
        self.assertEqual(st.get("budgetState"), "keeping-up", f"waiter: {st}")

    def test_client_hints_only_shorten_the_wait(self):
        self.hold("wq")
        b = self.acquire("wq", wait=False)
        self.assertEqual(b.error, "io.slotbroker.Busy", f"wait: false must refuse at once: {b.msg}")
        self.assertTrue(1 <= b.params["retryAfterSec"] <= 60, b.msg)
        t0 = time.monotonic()
        q = self.queue("wq", queueWaitMs=300)
        self.assertEqual(q.params.get("budgetMs"), 300, f"queueWaitMs caps the budget: {q.msg}")
        q.until(lambda a: a.error, timeout=0.3 + LATENESS + 1, what="the QueueTimeout")
        elapsed = time.monotonic() - t0
        self.assertEqual(q.error, "io.slotbroker.QueueTimeout", q.msg)
        # brokerd's wait lies within the test's (both monotonic; ms truncate): no slack for speed needed.
        self.assertTrue(300 <= q.params["waitedMs"] <= elapsed * 1000, f"waitedMs {q.params['waitedMs']} for a "
                        f"300 ms cap, refused after {elapsed:.3f} s")
        assert_on_time(elapsed, 0.3, "refused for a 300 ms cap")

    def test_position_updates_arrive_at_most_once_a_second(self):
        self.hold("wq", job="holder")
        ahead = [self.queue("wq", job=f"ahead{i}") for i in range(5)]
        last = self.queue("wq", job="last")
        self.assertEqual((last.params["position"], last.params["queued"]), (6, 6))
        t0 = time.monotonic()
        # One leaves: the update follows (within the second after the last one sent).
        ahead[0].close()
        last.until(lambda a: len(a.replies) > 1, timeout=2.5, what="a position update")
        self.assertEqual((last.params["position"], last.params["queued"]), (5, 5))
        self.assertTrue(last.continues)
        # Four leave at once, right after that update: one coalesced update, not four.
        for a in ahead[1:]:
            a.close()
        last.until(lambda a: len(a.replies) > 2, timeout=2.5, what="the coalesced position update")
        self.assertEqual((last.params["position"], last.params["queued"]), (1, 1),
                         f"four left at once: one update with the new position: {last.replies}")
        self.assertIsNone(last.conn.poll(1.2), "no update more when nothing changed")
        seen = [(round(t - t0, 3), m["parameters"]["position"]) for t, m in zip(last.times, last.replies)]
        gaps = [b - a for a, b in zip(last.times, last.times[1:])]
        self.assertGreaterEqual(min(gaps), 0.9, f"updates at most once a second; (time, position): {seen}")
        self.assertEqual(self.waiters("wq")[0]["position"], 1)

    def test_jammed_pool_times_out_then_sheds(self):
        """SPEC §3.1's jammed example with Q = 2s: A and B hold for ever; C queues (keeping up, budget Q)
        and is refused QueueTimeout at Q after its arrival; D queues once idle > Q (saturated, budget
        Q/10 at least 1 s) and is refused QueueShed after that budget."""
        self.hold("jam", job="A")
        self.hold("jam", job="B")
        t_c = time.monotonic()
        c = self.queue("jam", job="C")
        self.assertEqual(c.params["budgetMs"], 2000, f"C keeps up: budget Q: {c.msg}")
        c.until(lambda a: a.error, timeout=2 + LATENESS + 1, what="C's refusal")
        t_c_refused = time.monotonic() - t_c
        self.assertEqual(c.error, "io.slotbroker.QueueTimeout", c.msg)
        self.assertTrue(2000 <= c.params["waitedMs"] <= t_c_refused * 1000,
                        f"C waited {c.params['waitedMs']} ms, not Q (refused after {t_c_refused:.3f} s)")
        assert_on_time(t_c_refused, 2, "C refused")
        self.assertTrue(1 <= c.params["retryAfterSec"] <= 2, c.msg)
        self.assertEqual(c.params["pool"], "jam")
        # No fast admission since A and B: the pool is congested (idle > Q).
        p = wait_for(lambda: (lambda p: p if p["congested"] else None)(self.broker.pool("jam")),
                     message="pool jam to be congested")
        # Congested means idle > Q in brokerd's µs; Status truncates to ms, so 2000.4 ms shows as 2000.
        self.assertGreaterEqual(p["idleMs"], 2000)
        self.assertEqual(p["queueTimeoutMs"], 2000)
        t_d = time.monotonic()
        d = self.queue("jam", job="D")
        self.assertEqual(d.params["budgetMs"], 1000, f"D arrives saturated: budget Q/10, at least 1 s: {d.msg}")
        d.until(lambda a: a.error, timeout=1 + LATENESS + 1, what="D's refusal")
        t_d_refused = time.monotonic() - t_d
        self.assertEqual(d.error, "io.slotbroker.QueueShed", d.msg)
        self.assertTrue(1000 <= d.params["waitedMs"] <= t_d_refused * 1000,
                        f"D waited {d.params['waitedMs']} ms (refused after {t_d_refused:.3f} s)")
        assert_on_time(t_d_refused, 1, "D refused")
        self.assertTrue(1 <= d.params["retryAfterSec"] <= 2, d.msg)

    def test_disconnect_while_waiting_frees_its_place(self):
        self.hold("wq", job="holder")
        first, inode = self.tracked_acquire("wq", job="first")
        second = self.queue("wq", job="second")
        self.assertEqual(second.params["position"], 2)
        self.assertEqual([(w["job"], w["position"]) for w in self.waiters("wq")], [("first", 1), ("second", 2)])
        self.close_and_wait(first, inode)
        self.assertEqual([(w["job"], w["position"]) for w in self.waiters("wq")], [("second", 1)],
                         "the waiter that left must leave no trace")
        self.assertEqual(self.broker.pool("wq")["waiting"], 1)
        second.until(lambda a: a.queued and a.params["position"] == 1, timeout=2.5, what="position 1")
        self.assertEqual(second.params["queued"], 1)

    def test_nothing_leaks_after_many_cycles(self):
        b = self.broker
        wait_for(lambda: not b.client_connections(), message="no client connection left in brokerd")
        baseline = b.fd_count()
        for i in range(40):
            g = b.acquire("ff")                      # granted, then the holder closes
            self.assertTrue(g.granted, g.msg)
            w = b.acquire("wq")                      # granted: wq has one slot
            q = b.acquire("wq", job=f"q{i}")         # queued, then goes away
            self.assertTrue(q.queued, q.msg)
            t = b.acquire("wq", queueWaitMs=1)       # queued, times out
            t.until(lambda a: a.error, what="the timeout")
            self.assertEqual(t.error, "io.slotbroker.QueueTimeout")
            with b.connect() as c:                   # a Release of nothing, a Status
                self.expect_error(lambda: c.call("io.slotbroker.Release", {"lease": "0" * 32}),
                                  "io.slotbroker.NoSuchLease")
                c.call("io.slotbroker.Status")
            for a in (g, w, q, t):
                a.close()
        b.wait_idle()
        wait_for(lambda: not b.client_connections(), message="brokerd to close every connection")
        wait_for(lambda: b.fd_count() == baseline, message=f"brokerd's fd count back to {baseline}")

    def test_plain_acquire_holds_while_the_connection_is_open(self):
        a, inode = self.tracked_acquire("rel", more=False)
        self.assertTrue(a.granted, a.msg)
        self.assertFalse(a.continues, "Acquire without more has a single reply")
        self.assertEqual(len(self.holders("rel")), 1)
        self.close_and_wait(a, inode)
        self.assertEqual(self.holders("rel"), [])

    # ---- leases with a command ----

    def test_command_holds_the_slot_after_the_connection_closes(self):
        child = Child()
        self.addCleanup(child.kill)
        a, inode = self.tracked_acquire("cmd", pid=child.pid, job="with-command")
        self.assertTrue(a.granted, a.msg)
        self.assertEqual(a.lease["commandPid"], child.pid)
        self.close_and_wait(a, inode)
        [h] = self.holders("cmd")
        self.assertEqual((h["state"], h["lease"]["commandPid"]), ("held", child.pid),
                         "the command still runs: its lease must stay")
        w = self.queue("cmd", job="next")
        t0 = time.monotonic()
        self.assertEqual(child.finish(), 0)
        w.until_granted(timeout=1 + LATENESS + 1)
        # Within the second brokerd takes to see a group empty (≤ ~1 s).
        self.assertLess(time.monotonic() - t0, 1 + LATENESS, "the slot frees within ~1 s of the command's exit")

    def test_grandchild_in_the_group_keeps_the_slot(self):
        child = Child(grandchild=True)
        self.addCleanup(child.kill)
        pidfds = self.broker.pidfd_count()
        a, inode = self.tracked_acquire("cmd", pid=child.pid)
        self.assertTrue(a.granted, a.msg)
        self.assertEqual(self.broker.pidfd_count(), pidfds + 1, "brokerd watches the command with a pidfd")
        self.close_and_wait(a, inode)
        self.assertEqual(child.finish(), 0)
        # brokerd has seen the leader exit once it closes its pidfd; the group still has the grandchild.
        wait_for(lambda: self.broker.pidfd_count() == pidfds, message="brokerd to see the leader exit")
        self.assertTrue(child.group_alive())
        [h] = self.holders("cmd")
        self.assertEqual(h["state"], "held", "a grandchild left in the group must keep the slot")
        t0 = time.monotonic()
        child.kill_grandchild()
        wait_for(lambda: not self.holders("cmd"), timeout=1 + LATENESS + 1,
                 message="the slot to free once the group is empty")
        self.assertLess(time.monotonic() - t0, 1 + LATENESS, "the slot frees within ~1 s of the group's last exit")

    def test_pid_must_be_the_peer_or_its_child(self):
        grandchild = Child(grandchild=True)
        self.addCleanup(grandchild.kill)
        other_uid = Child(user=NOBODY_UID, group=NOGROUP_GID)
        self.addCleanup(other_uid.kill)
        pid_max = int(harness.read_text("/proc/sys/kernel/pid_max"))
        missing = next(p for p in range(pid_max - 1, 1, -1) if not os.path.exists(f"/proc/{p}"))
        for pid, what in ((1, "init"), (grandchild.grandchild, "a grandchild"), (other_uid.pid, "a child of another uid"),
                          (missing, "no process")):
            with self.subTest(what):
                a = self.acquire("cmd", pid=pid)
                self.assertEqual(a.error, "org.varlink.service.InvalidParameter", f"pid of {what}: {a.msg}")
                self.assertEqual(a.params.get("parameter"), "pid")
        self.assertEqual(self.holders("cmd"), [])
        # The peer itself: a client process that names its own pid.
        p = spawn_client_as(self.path, "io.slotbroker.Acquire", {"lane": "cmd"}, uid=0, gid=0, pid_self=True)
        self.addCleanup(harness.stop_client, p)
        msg = read_json_line(p)
        self.assertEqual(msg["parameters"]["state"], "granted", msg)
        self.assertEqual(msg["parameters"]["lease"]["commandPid"], p.pid)
        harness.stop_client(p)
        wait_for(lambda: not self.holders("cmd"), message="the peer's lease to end with it")

    def test_release_of_a_running_command_revokes_and_waits_for_it(self):
        child = Child()
        self.addCleanup(child.kill)
        a = self.hold("rel", pid=child.pid)
        self.assertEqual(self.call("io.slotbroker.Release", {"lease": a.lease["id"]}), {})
        a.until(lambda x: x.state == "revoked", timeout=2, what="the revocation")
        self.assertFalse(a.continues, "revoked is the final reply")
        [h] = self.holders("rel")
        self.assertEqual(h["state"], "revoked", "the slot frees only when the command is gone")
        a.close()
        wait_for(lambda: [h["state"] for h in self.holders("rel")] == ["overdue"],
                 message="the lease to be overdue once nobody is left to stop the command")
        self.assertEqual(child.finish(), 0)
        wait_for(lambda: not self.holders("rel"), timeout=3, message="the slot to free when the command exits")

    # ---- max-hold, release, detach ----

    def test_longest_client_max_hold_has_a_real_expiry(self):
        a = self.hold("rel", maxHoldMs=MAX_HOLD_MS)
        self.assertEqual(a.lease["expiresAt"] - a.lease["grantedAt"], MAX_HOLD_MS * 1000,
                         f"3650 days from the grant: {a.lease}")
        a.close()

    def test_client_max_hold_revokes(self):
        t0 = time.monotonic()
        a = self.hold("rel", maxHoldMs=500)
        self.assertIsNotNone(a.lease.get("expiresAt"))
        self.assertAlmostEqual(a.lease["expiresAt"] - a.lease["grantedAt"], 500_000, delta=2000)
        a.until(lambda x: x.state == "revoked", timeout=0.5 + LATENESS + 1, what="the revocation")
        self.assertFalse(a.continues)
        assert_on_time(time.monotonic() - t0, 0.5, "revoked at maxHoldMs")

    def test_release_from_another_connection(self):
        h = self.hold("rel", job="h")
        lease = h.lease["id"]
        self.assertEqual(self.call("io.slotbroker.Release", {"lease": lease}), {})
        h.until(lambda a: a.state == "released", timeout=2, what="the release")
        self.assertFalse(h.continues, "released is the final reply")
        self.assertEqual(self.holders("rel"), [])
        # The Acquire has ended: the same connection serves other calls again.
        self.assertIn("interfaces", h.conn.call("org.varlink.service.GetInfo"))
        self.expect_error(lambda: self.call("io.slotbroker.Release", {"lease": lease}), "io.slotbroker.NoSuchLease",
                          lease=lease)
        self.expect_error(lambda: self.call("io.slotbroker.Release", {"lease": "nosuchlease"}),
                          "io.slotbroker.NoSuchLease", lease="nosuchlease")

    def test_release_is_for_the_owner_or_root(self):
        h = self.hold("rel")
        out = run_client_as(self.path, "io.slotbroker.Release", {"lease": h.lease["id"]})
        self.assertEqual(out[0].get("error"), "io.slotbroker.PermissionDenied", f"nobody released root's lease: {out}")
        # The reason is the lease's owner, not the lane's access list.
        self.assertEqual(out[0].get("parameters"), {"lease": h.lease["id"]}, out)
        self.assertEqual(len(self.holders("rel")), 1, "a refused Release changes nothing")
        self.assertIsNone(h.conn.poll(0), "the holder must not hear of a refused Release")
        # A lease of nobody's: another non-root uid may not release it, its owner may.
        p = spawn_client_as(self.path, "io.slotbroker.Acquire", {"lane": "open"})
        self.addCleanup(harness.stop_client, p)
        g = read_json_line(p)
        self.assertEqual(g["parameters"]["lease"]["uid"], NOBODY_UID, g)
        lease = g["parameters"]["lease"]["id"]
        out = run_client_as(self.path, "io.slotbroker.Release", {"lease": lease}, uid=65533, gid=65533)
        self.assertEqual(out[0].get("error"), "io.slotbroker.PermissionDenied", f"uid 65533 released nobody's: {out}")
        out = run_client_as(self.path, "io.slotbroker.Release", {"lease": lease})
        self.assertNotIn("error", out[0], f"the owner's Release: {out}")
        self.assertEqual(out[0].get("parameters") or {}, {}, f"the owner's Release: {out}")
        self.assertEqual(read_json_line(p)["parameters"]["state"], "released")
        self.assertEqual(harness.stop_client(p), 0)

    def test_detached_lease_outlives_its_connection(self):
        a, inode = self.tracked_acquire("det", detach=True, maxHoldMs=60000, job="setup")
        self.assertTrue(a.granted, a.msg)
        self.assertTrue(a.lease["detached"])
        self.assertFalse(a.continues, "a detached grant is the final reply")
        self.assertIn("interfaces", a.conn.call("org.varlink.service.GetInfo"), "the connection is free again")
        self.close_and_wait(a, inode)
        [h] = self.holders("det")
        self.assertTrue(h["lease"]["detached"])
        self.assertEqual(self.call("io.slotbroker.Release", {"lease": a.lease["id"]}), {})
        self.assertEqual(self.holders("det"), [])
        # And one that ends at its maxHoldMs.
        t0 = time.monotonic()
        b = self.acquire("det", detach=True, maxHoldMs=700)
        self.assertTrue(b.granted, b.msg)
        b.close()
        wait_for(lambda: not self.holders("det"), timeout=0.7 + LATENESS + 1,
                 message="the detached lease to end at maxHoldMs")
        assert_on_time(time.monotonic() - t0, 0.7, "the detached lease ended")

    # ---- administration ----

    def test_drain_and_undrain_a_member(self):
        self.assertEqual(self.call("io.slotbroker.Drain", {"pool": "rig", "member": "m1", "on": True}), {})
        self.addCleanup(lambda: self.call("io.slotbroker.Drain", {"pool": "rig", "member": "m1", "on": False}))
        p = self.broker.pool("rig")
        self.assertEqual((p["members"], p["drained"]), (["m1", "m2"], False))
        a = self.hold("rig")
        self.assertEqual((a.lease["slots"], a.lease["members"]), ([1], ["m2"]), "a drained member is not granted")
        w = self.queue("rig")
        self.assertEqual(self.call("io.slotbroker.Drain", {"pool": "rig", "member": "m1", "on": False}), {})
        w.until_granted(timeout=2)
        self.assertEqual((w.lease["slots"], w.lease["members"]), ([0], ["m1"]))

    def test_status_reports_drained_members(self):
        self.call("io.slotbroker.Drain", {"pool": "rig", "member": "m2", "on": True})
        self.addCleanup(lambda: self.call("io.slotbroker.Drain", {"pool": "rig", "member": "m2", "on": False}))
        self.assertEqual(self.broker.pool("rig").get("drainedMembers"), ["m2"])
        self.call("io.slotbroker.Drain", {"pool": "rig", "member": "m2", "on": False})
        self.assertFalse(self.broker.pool("rig").get("drainedMembers"))

    def test_drain_and_undrain_a_pool(self):
        a = self.hold("rig")
        b = self.hold("rig")
        w = self.queue("rig", job="w")
        self.assertEqual(self.call("io.slotbroker.Drain", {"pool": "rig", "on": True}), {})
        self.addCleanup(lambda: self.call("io.slotbroker.Drain", {"pool": "rig", "on": False}))
        w.until(lambda x: x.error, timeout=2, what="the waiter's refusal")
        self.assertEqual(w.error, "io.slotbroker.Unavailable", w.msg)
        self.assertEqual(w.params.get("pool"), "rig")
        self.assertIsInstance(w.params.get("retryAfterSec"), int)
        self.assertTrue(self.broker.pool("rig")["drained"])
        self.assertEqual(len(self.holders("rig")), 2, "holders of a drained pool finish")
        n = self.acquire("rig")
        self.assertEqual(n.error, "io.slotbroker.Unavailable", f"a drained pool grants nothing new: {n.msg}")
        a.close()
        wait_for(lambda: len(self.holders("rig")) == 1, message="a holder of the drained pool to finish")
        self.assertEqual(self.call("io.slotbroker.Drain", {"pool": "rig", "on": False}), {})
        self.assertFalse(self.broker.pool("rig")["drained"])
        self.hold("rig")
        b.close()

    def test_drained_waiter_is_told_reason_drained(self):
        self.hold("rig")
        self.hold("rig")
        w = self.queue("rig")
        self.call("io.slotbroker.Drain", {"pool": "rig", "on": True})
        self.addCleanup(lambda: self.call("io.slotbroker.Drain", {"pool": "rig", "on": False}))
        w.until(lambda x: x.error, timeout=2, what="the refusal")
        self.assertEqual(w.params.get("reason"), "drained", w.msg)

    def test_drain_unknown_pool_is_no_such_pool(self):
        self.expect_error(lambda: self.call("io.slotbroker.Drain", {"pool": "nosuchpool", "on": True}),
                          "io.slotbroker.NoSuchPool", pool="nosuchpool")
        self.expect_error(lambda: self.call("io.slotbroker.Drain", {"pool": "rig", "member": "m9", "on": True}),
                          "io.slotbroker.NoSuchPool", pool="rig", member="m9")

    def test_cancel_refuses_the_waiters_that_match(self):
        self.hold("wq")
        w1 = self.queue("wq", job="j1")
        w2 = self.queue("wq", job="j2")
        w3 = self.queue("wq-other", job="j2")
        self.assertEqual(self.call("io.slotbroker.Cancel", {"job": "j1"}), {"cancelled": 1})
        w1.until(lambda x: x.error, timeout=2, what="the cancellation")
        self.assertEqual(w1.error, "io.slotbroker.Unavailable")
        self.assertEqual((w1.params.get("reason"), w1.params.get("pool")), ("cancelled", "wq"))
        self.assertEqual(self.call("io.slotbroker.Cancel", {"uid": 12345}), {"cancelled": 0})
        self.assertEqual(self.call("io.slotbroker.Cancel", {"pool": "ff"}), {"cancelled": 0})
        self.assertEqual(self.call("io.slotbroker.Cancel", {"lane": "wq-other", "job": "j2"}), {"cancelled": 1})
        w3.until(lambda x: x.error, timeout=2, what="the cancellation")
        self.assertEqual([w["job"] for w in self.waiters("wq")], ["j2"])
        self.assertIsNone(w2.conn.poll(0), "a waiter that matched no filter hears nothing")
        self.assertEqual(self.call("io.slotbroker.Cancel", {"pool": "wq", "uid": os.getuid()}), {"cancelled": 1})
        self.assertEqual(self.waiters("wq"), [])

    def test_admin_methods_are_refused_to_other_users(self):
        for method, params in (("io.slotbroker.Reload", {}), ("io.slotbroker.Drain", {"pool": "rig", "on": True}),
                               ("io.slotbroker.Cancel", {})):
            with self.subTest(method):
                out = run_client_as(self.path, method, params)
                self.assertIn(out[0].get("error"), ("io.slotbroker.PermissionDenied",
                                                    "org.varlink.service.PermissionDenied"), f"{method} as nobody: {out}")
        self.assertFalse(self.broker.pool("rig")["drained"])
        out = run_client_as(self.path, "io.slotbroker.Status")
        self.assertIn("pools", out[0].get("parameters", {}), f"Status is for everyone: {out}")

    def test_lane_acl(self):
        out = run_client_as(self.path, "io.slotbroker.Acquire", {"lane": "rootonly"}, more=True,
                            extra_groups=[NOGROUP_GID])
        self.assertEqual(out[0].get("error"), "io.slotbroker.PermissionDenied", f"nobody on a root-only lane: {out}")
        self.assertEqual(out[0]["parameters"].get("lane"), "rootonly")
        out = run_client_as(self.path, "io.slotbroker.Acquire", {"lane": "groupok"}, more=True,
                            extra_groups=[NOGROUP_GID])
        self.assertEqual(out[0].get("parameters", {}).get("state"), "granted", f"nobody in group nogroup: {out}")
        out = run_client_as(self.path, "io.slotbroker.Acquire", {"lane": "groupok"}, uid=65533, gid=65533, more=True)
        self.assertEqual(out[0].get("error"), "io.slotbroker.PermissionDenied", f"uid 65533 in no allowed group: {out}")
        self.hold("rootonly")  # root always may

    def test_lane_acl_counts_the_primary_group(self):
        out = run_client_as(self.path, "io.slotbroker.Acquire", {"lane": "groupok"}, more=True)  # gid nogroup only
        self.assertEqual(out[0].get("parameters", {}).get("state"), "granted",
                         f"nobody with primary group nogroup on a lane allowing nogroup: {out}")

    # ---- reload ----

    def start_broker(self, config, **kw):
        b = Broker(config, mode=self.MODE, name="brokerd-aux", **kw).start()
        self.addCleanup(b.stop)
        return b

    def test_reload_keeps_leases_and_waiters(self):
        b = self.start_broker(RELOAD_BASE)
        h1, i1 = b.tracked(lambda: b.acquire("shrink"))
        h2, i2 = b.tracked(lambda: b.acquire("shrink"))
        self.assertTrue(h1.granted and h2.granted)
        w = b.acquire("shrink")
        self.assertTrue(w.queued, w.msg)
        for a in (h1, h2, w):
            self.addCleanup(a.close)
        self.expect_error(lambda: b.call("io.slotbroker.Acquire", {"lane": "fresh"}), "io.slotbroker.NoSuchLane")

        b.write_config(RELOAD_GROWN)
        self.assertEqual(b.reload(), {})
        p = b.pool("shrink")
        self.assertEqual((p["limit"], p["inUse"], p["waiting"]), (1, 2, 1), "a shrunk pool lets its holders finish")
        self.assertEqual(len(b.status()["holders"]), 2)
        self.assertIsNone(h1.conn.poll(0), "a reload must not disturb a holder")
        f = b.acquire("fresh")
        self.addCleanup(f.close)
        self.assertTrue(f.granted, f"the new lane works: {f.msg}")
        # The holder above the new limit (slot 1) finishes first: still no room for the waiter.
        above, below = (h1, h2) if h1.lease["slots"] == [1] else (h2, h1)
        self.close_and_wait_on(b, above, i1 if above is h1 else i2)
        self.assertEqual((b.pool("shrink")["inUse"], b.pool("shrink")["waiting"]), (1, 1))
        self.assertIsNone(w.conn.poll(0), "no grant while the new limit is reached")
        below.close()
        w.until_granted(timeout=2)
        self.assertEqual(w.lease["slots"], [0])

        # An invalid configuration is rejected whole, with errors naming file:line and key.
        b.write_config(RELOAD_INVALID)
        err = self.expect_error(b.reload, "io.slotbroker.ReloadFailed")
        errors = err["errors"]
        self.assertTrue(errors, err)
        text = "\n".join(errors)
        policy_line = lines_of(RELOAD_INVALID, "policy = sometimes")
        self.assertIn(f"{b.config_path}:{policy_line}", text, f"errors must name file:line: {errors}")
        self.assertIn("policy", text)
        self.assertIn("nosuchpool", text, f"the missing pool must be named: {errors}")
        self.assertEqual(b.pool("shrink")["limit"], 1, "the old configuration stays")
        g = b.acquire("fresh", wait=False)
        self.addCleanup(g.close)
        self.assertEqual(g.error, "io.slotbroker.Busy", f"lane fresh still configured: {g.msg}")
        self.assertTrue(b.alive())

    def test_reload_names_unknown_users_and_groups(self):
        b = self.start_broker(RELOAD_BASE)
        config = RELOAD_BASE + "allow-users = root no-such-user-slotbroker\nallow-groups = no-such-group-slotbroker\n"
        b.write_config(config)
        err = self.expect_error(b.reload, "io.slotbroker.ReloadFailed")
        lane_line = lines_of(config, "[lane shrink]")
        self.assertEqual(sorted(err["errors"]),
                         [f'{b.config_path}:{lane_line}: allow-groups: unknown group "no-such-group-slotbroker"',
                          f'{b.config_path}:{lane_line}: allow-users: unknown user "no-such-user-slotbroker"'])
        self.assertTrue(b.alive())

    def test_reload_refuses_waiters_the_lane_no_longer_allows(self):
        """An operator takes a user off a lane's allow-users= and reloads: that user's queued requests must not
        be granted later. They are refused (PermissionDenied, as a new request would be); holders keep their
        leases, and waiters still allowed keep their place."""
        config = RELOAD_BASE.replace("limit = 2", "limit = 1") + "allow-users = root nobody\n"
        b = self.start_broker(config)
        h = b.acquire("shrink")
        self.addCleanup(h.close)
        self.assertTrue(h.granted, h.msg)
        p = spawn_client_as(b.socket_path, "io.slotbroker.Acquire", {"lane": "shrink", "job": "revoked"})
        self.addCleanup(harness.stop_client, p)
        self.assertEqual(read_json_line(p)["parameters"]["state"], "queued")
        kept = b.acquire("shrink")
        self.addCleanup(kept.close)
        self.assertTrue(kept.queued, kept.msg)

        b.write_config(config.replace("allow-users = root nobody", "allow-users = root"))
        self.assertEqual(b.reload(), {})
        msg = read_json_line(p, timeout=2)
        while (msg.get("parameters") or {}).get("state") == "queued":  # its place in the queue, told as it moves
            msg = read_json_line(p, timeout=2)
        self.assertEqual((msg.get("error"), msg.get("parameters")), ("io.slotbroker.PermissionDenied", {"lane": "shrink"}),
                         f"nobody's waiter after its permission was withdrawn: {msg}")
        wait_for(lambda: f"[LANE_DENIED] uid {NOBODY_UID} may not use lane shrink" in b.log(), message="the refusal audited")
        self.assertEqual(b.pool("shrink")["waiting"], 1, "root's waiter keeps its place")
        self.assertIsNone(h.conn.poll(0), "a reload must not disturb a holder")
        h.close()
        kept.until_granted(timeout=2)

    def test_reload_says_which_settings_wait_for_a_restart(self):
        """[broker] keys read at start only: a reload that changes them says so, rather than leaving an
        operator to believe that, say, a shorter history-retention= prunes the database now."""
        b = self.start_broker("[broker]\nhistory-retention = 30d\n" + RELOAD_BASE)
        b.write_config(f"[broker]\nhistory-retention = 1d\nstate-directory = {b.dir}/elsewhere\n" + RELOAD_BASE)
        self.assertEqual(b.reload(), {})
        log = b.log()
        for key in ("history-retention", "state-directory"):
            self.assertIn(f"{key}= changed; it takes effect when brokerd restarts.", log)
        self.assertNotIn("socket= changed", log, "only what changed is named")

    def test_reload_keeps_the_configuration_when_every_file_is_gone(self):
        """brokerd without --config reads /etc/brokerd/brokerd.conf, which may be missing: with no file at all it
        runs the embedded default. At a reload, no file at all is an operator's slip (the file moved into
        brokerd.conf.d/ without its .conf suffix, a tool that deletes before it writes), and the embedded default
        would remove every pool and refuse every waiter: the running configuration stays. The test gives brokerd
        an /etc/brokerd of its own (an overlay of /etc in a mount namespace)."""
        etc = tempfile.mkdtemp(prefix="brokerd-etc-")
        self.addCleanup(shutil.rmtree, etc, ignore_errors=True)
        for d in ("upper", "work", "brokerd"):
            os.mkdir(os.path.join(etc, d))
        setup = (f'mount -t overlay overlay -o lowerdir=/etc,upperdir={etc}/upper,workdir={etc}/work /etc && '
                 f'mkdir /etc/brokerd && mount --bind {etc}/brokerd /etc/brokerd')
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", setup],
                               capture_output=True, text=True)
        if probe.returncode != 0:
            self.skipTest(f"no overlay of /etc here: {probe.stderr.strip()}")
        shutil.rmtree(os.path.join(etc, "upper", "brokerd"))
        main = os.path.join(etc, "brokerd", "brokerd.conf")
        with open(main, "w") as f:
            f.write(RELOAD_BASE)
        b = harness.MountNamespaceBroker(None, setup, name="brokerd-etc")
        os.mkdir(b.state_dir)
        self.addCleanup(b.cleanup)
        b.start()
        h = b.acquire("shrink")
        h2 = b.acquire("shrink")
        w = b.acquire("shrink")
        for a in (h, h2, w):
            self.addCleanup(a.close)
        self.assertTrue(w.queued, w.msg)

        os.mkdir(main + ".d")
        os.rename(main, main + ".d/site")  # not *.conf: not read
        err = self.expect_error(b.reload, "io.slotbroker.ReloadFailed")
        self.assertEqual(len(err["errors"]), 1, err)
        self.assertIn("no configuration file", err["errors"][0])
        self.assertIn("/etc/brokerd/brokerd.conf", err["errors"][0])
        p = b.pool("shrink")
        self.assertEqual((p["limit"], p["inUse"], p["waiting"]), (2, 2, 1), "the running configuration stays")
        self.assertIsNone(w.conn.poll(0), "its waiter keeps its place")
        self.assertNotIn("default", [p["name"] for p in b.status()["pools"]])

        os.rename(main + ".d/site", main + ".d/site.conf")
        self.assertEqual(b.reload(), {})
        self.assertEqual(b.pool("shrink")["waiting"], 1)

    def test_reload_says_when_a_removed_pool_still_has_holders(self):
        """A pool renamed is a pool removed and another added: the old one's holders keep their slots, which the
        new one does not count, and the removed pool leaves Status's pools and the metrics. The journal says
        so, naming what stays held, so that an operator who meant a rename sees the capacity counted twice."""
        b = self.start_broker(RELOAD_BASE + "[pool spare]\nlimit = 1\n")
        h = b.acquire("shrink")
        self.addCleanup(h.close)
        self.assertTrue(h.granted, h.msg)
        renamed = RELOAD_BASE.replace("[pool shrink]", "[pool grid]").replace("pools = shrink", "pools = grid")
        b.write_config(renamed)
        self.assertEqual(b.reload(), {})
        self.assertIn("Pool shrink was removed with 1 slot(s) held", b.log())
        self.assertNotIn("Pool spare was removed", b.log(), "a pool removed with nothing held needs no word")
        self.assertIsNone(h.conn.poll(0), "a reload must not disturb a holder")

    def test_reload_storm(self):
        """A hundred SIGHUPs in a row, between configurations that shrink, grow and break: brokerd stays up, keeps its
        holder undisturbed and its fds where they were, and ends on the configuration written last."""
        b = self.start_broker(RELOAD_BASE)
        h = b.acquire("shrink")
        self.addCleanup(h.close)
        self.assertTrue(h.granted, h.msg)
        fds = b.fd_count()
        for i in range(100):
            b.write_config((RELOAD_BASE, RELOAD_GROWN, RELOAD_INVALID)[i % 3])
            b.sighup()
        b.write_config(RELOAD_GROWN.replace("limit = 1\n\n[lane fresh]", "limit = 3\n\n[lane fresh]"))
        b.sighup()
        wait_for(lambda: b.pool("fresh")["limit"] == 3, message="the configuration written last")
        self.assertTrue(b.alive())
        self.assertEqual(b.pool("shrink")["inUse"], 1)
        self.assertIsNone(h.conn.poll(0), "a reload must not disturb a holder")
        # The Status calls' connections close on brokerd's side a moment after the client's.
        wait_for(lambda: b.fd_count() == fds, message=f"brokerd's fds back to {fds}")

    def test_sd_notify_around_a_reload(self):
        """RELOADING=1 (with MONOTONIC_USEC=, which Type=notify-reload needs to match it to its SIGHUP) then
        READY=1, for a reload that applies and for one that is refused; STATUS= leaves "Reloading" either way."""
        b = self.start_broker(RELOAD_BASE, notify=True)
        b.notify.wait_for(lambda a: [x for x in a if x[1:] == ("READY", "1")], message="READY=1")

        def around(reload):
            n = len(b.notify.assignments())
            t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            reload()
            seen = b.notify.wait_for(lambda a: a[n:] if [x for x in a[n:] if x[1:] == ("READY", "1")] else None,
                                     message="READY=1 after the reload")
            keys = [k for _, k, _ in seen]
            self.assertLess(keys.index("RELOADING"), keys.index("READY"), seen)
            [mono] = [int(v) for _, k, v in seen if k == "MONOTONIC_USEC"]
            self.assertGreaterEqual(mono, t0, "MONOTONIC_USEC= is the time of the reload")
            self.assertTrue(all(pid == b.pid for pid, _, _ in seen))
            b.notify.wait_for(lambda a: [v for _, k, v in a if k == "STATUS"][-1].startswith("shrink "),
                              message="STATUS= with the pools' usage again")

        b.write_config(RELOAD_GROWN)
        around(b.reload)
        b.write_config(RELOAD_INVALID)
        around(lambda: self.expect_error(b.reload, "io.slotbroker.ReloadFailed"))
        around(b.sighup)

    def test_reload_refuses_waiting_reservations_of_an_administrator_removed(self):
        """As for lanes: a user taken off a pool's admin-users= keeps no reservation waiting in it (a restart
        already re-checks it when the connection comes back)."""
        config = (RELOAD_BASE.replace("limit = 2", "limit = 1") + "[pool rigs]\nmembers = m1\nadmin-users = nobody\n"
                  "[lane rigs]\npools = rigs\n")
        b = self.start_broker(config)
        h = b.acquire("rigs")
        self.addCleanup(h.close)
        self.assertTrue(h.granted, h.msg)
        p = spawn_client_as(b.socket_path, "io.slotbroker.Reserve",
                            {"pool": "rigs", "member": "m1", "forMs": 60000, "reason": "bench"})
        self.addCleanup(harness.stop_client, p)
        self.assertEqual(read_json_line(p)["parameters"]["state"], "queued")

        b.write_config(config.replace("admin-users = nobody\n", ""))
        self.assertEqual(b.reload(), {})
        msg = read_json_line(p, timeout=2)
        while (msg.get("parameters") or {}).get("state") == "queued":
            msg = read_json_line(p, timeout=2)
        self.assertEqual((msg.get("error"), msg.get("parameters")), ("io.slotbroker.PermissionDenied", {"pool": "rigs"}),
                         f"the reservation of an administrator removed: {msg}")
        wait_for(lambda: "[ADMIN_DENIED]" in b.log(), message="the refusal audited")
        self.assertEqual(b.pool("rigs")["waiting"], 0)

    def test_check_config_warns_of_names_this_host_does_not_know(self):
        """--check-config, run before a reload as brokerd(8) says, must not pass in silence a configuration that
        this host's brokerd will refuse. It may run on another host than brokerd's (a repository's CI), so it
        warns and exits 0; brokerd itself refuses the names (test_reload_names_unknown_users_and_groups)."""
        b = Broker(RELOAD_BASE + "allow-users = root no-such-user-slotbroker\n"
                   "[pool admin]\nlimit = 1\nadmin-groups = no-such-group-slotbroker\n", name="brokerd-check")
        self.addCleanup(b.cleanup)
        out = b.check_config()
        self.assertEqual(out.returncode, 0, out.stderr)
        ON_HOST = "(brokerd refuses this configuration on this host)"
        lane_line = lines_of(RELOAD_BASE, "[lane shrink]")
        pool_line = len(RELOAD_BASE.splitlines()) + 2
        self.assertEqual(sorted(line for line in out.stderr.splitlines() if line.startswith("warning:")),
                         [f'warning: {b.config_path}:{lane_line}: allow-users: unknown user "no-such-user-slotbroker" {ON_HOST}',
                          f'warning: {b.config_path}:{pool_line}: admin-groups: unknown group "no-such-group-slotbroker" {ON_HOST}'],
                         out.stderr)
        self.assertIn("[lane shrink]", out.stdout, "the effective configuration is printed all the same")

    def test_shrunk_pool_grants_nothing_above_its_new_limit(self):
        b = self.start_broker(RELOAD_BASE)
        h0, i0 = b.tracked(lambda: b.acquire("shrink"))
        h1 = b.acquire("shrink")
        w = b.acquire("shrink")
        for a in (h0, h1, w):
            self.addCleanup(a.close)
        self.assertEqual((h0.lease["slots"], h1.lease["slots"], w.state), ([0], [1], "queued"))
        b.write_config(RELOAD_GROWN)
        b.reload()
        self.close_and_wait_on(b, h0, i0)
        p = b.pool("shrink")
        self.assertEqual((p["limit"], p["inUse"], p["waiting"]), (1, 1, 1),
                         f"the waiter must wait for slot 1's holder, not over-subscribe the pool: {p}")
        self.assertIsNone(w.conn.poll(0), "the waiter was granted above the new limit")

    def close_and_wait_on(self, b, a, inode):
        a.close()
        b.wait_connection_gone(inode)

    def test_sighup_reloads(self):
        b = self.start_broker(RELOAD_BASE)
        b.write_config(RELOAD_GROWN)
        b.sighup()
        wait_for(lambda: b.pool("shrink")["limit"] == 1, message="SIGHUP to apply the new limit")
        a = b.acquire("fresh")
        self.addCleanup(a.close)
        self.assertTrue(a.granted, a.msg)
        b.write_config(RELOAD_INVALID)
        b.sighup()
        policy_line = lines_of(RELOAD_INVALID, "policy = sometimes")
        wait_for(lambda: f"{b.config_path}:{policy_line}" in b.log(), message="the reload error in brokerd's log")
        self.assertTrue(b.alive())
        self.assertEqual(b.pool("shrink")["limit"], 1, "the old configuration stays after a bad SIGHUP")
        f = b.acquire("fresh", wait=False)
        self.addCleanup(f.close)
        self.assertEqual(f.error, "io.slotbroker.Busy")

    # ---- sd_notify ----

    def test_sd_notify_ready_and_status(self):
        b = Broker(CONFIG, mode=self.MODE, notify=True, name="brokerd-notify")
        self.addCleanup(b.stop)
        if self.MODE == "activate":
            # systemd-socket-activate starts brokerd only on the first connection: until then there is a
            # socket but no daemon.
            b.start(wait=False)
            wait_for(lambda: os.path.exists(b.socket_path), message="the activator's socket")
            self.assertEqual(harness.read_text(f"/proc/{b.pid}/comm").strip(), "systemd-socket-")
            self.assertEqual(b.notify.assignments(), [], "nothing may notify before the daemon starts")
            b.wait_ready()
            self.assertTrue(os.path.realpath(f"/proc/{b.pid}/exe").endswith("brokerd"))
        else:
            b.start()
        ready = b.notify.wait_for(lambda a: [x for x in a if x[1] == "READY" and x[2] == "1"], message="READY=1")
        self.assertEqual(ready[0][0], b.pid, "READY=1 must come from the daemon's main pid")
        status = b.notify.wait_for(lambda a: [x[2] for x in a if x[1] == "STATUS"], message="STATUS=")
        for pool in ("ff", "wq", "jam", "rig"):
            self.assertIn(pool, status[-1], f"STATUS= must mention pool {pool}: {status[-1]!r}")
        # STATUS= follows usage.
        a = b.acquire("ff")
        self.addCleanup(a.close)
        self.assertTrue(a.granted)
        b.notify.wait_for(lambda x: [v for _, k, v in x if k == "STATUS" and "ff 1/2" in v], timeout=3,
                          message="STATUS= to show pool ff 1/2 in use")


class SelfBound(Scenarios, unittest.TestCase):
    """brokerd binds its socket itself (--socket)."""
    MODE = "bound"

    def test_socket_mode_and_clean_exit(self):
        b = self.start_broker(RELOAD_BASE)
        self.assertEqual(os.stat(b.socket_path).st_mode & 0o777, 0o666, "the self-bound socket is mode 0666")
        self.assertEqual(b.stop(), 0, "SIGTERM is a clean exit")
        self.assertFalse(os.path.exists(b.socket_path), "brokerd removes the socket it bound")

    def test_max_hold_revokes_holders(self):
        """max-hold = 1s: each holder gets a final {state: revoked}. One closes and frees its slot; one ignores
        it and is cut after the grace."""
        t0 = time.monotonic()
        polite = self.hold("hold", job="polite")
        deaf = self.hold("hold", job="deaf")
        self.assertAlmostEqual(polite.lease["expiresAt"] - polite.lease["grantedAt"], 1_000_000, delta=2000)
        polite.until(lambda a: a.state == "revoked", timeout=1 + LATENESS + 1, what="the revocation")
        t_revoked = time.monotonic() - t0
        assert_on_time(t_revoked, 1, "revoked for max-hold 1s")
        self.assertFalse(polite.continues, "revoked is the final reply")
        deaf.until(lambda a: a.state == "revoked", timeout=1, what="the revocation")
        self.assertEqual({h["lease"]["job"]: h["state"] for h in self.holders("hold")},
                         {"polite": "revoked", "deaf": "revoked"})
        polite.close()
        wait_for(lambda: [h["lease"]["job"] for h in self.holders("hold")] == ["deaf"],
                 message="the polite holder's slot to free when it closes")
        # The deaf holder keeps its connection open and reads nothing: brokerd cuts it after revoke-grace.
        deaf.conn.wait_eof(timeout=8)
        cut_after = time.monotonic() - t0
        self.assertGreater(cut_after, t_revoked + 1.5, "cut before revoke-grace = 2s")
        self.assertLess(cut_after, t_revoked + 2 + LATENESS, f"cut {cut_after - t_revoked:.2f} s after the revocation")
        wait_for(lambda: not self.holders("hold"), message="the deaf holder's slot to free")

    def test_max_hold_closes_a_plain_acquire(self):
        b = self.start_broker(MAX_HOLD_CONFIG)  # its own broker: the bug kills it
        t0 = time.monotonic()
        plain = b.acquire("hold", more=False)
        self.addCleanup(plain.close)
        self.assertTrue(plain.granted, plain.msg)
        plain.conn.wait_eof(timeout=1 + LATENESS + 1)  # a plain Acquire's life line is cut on revocation
        assert_on_time(time.monotonic() - t0, 1, "cut at max-hold")
        wait_for(lambda: not b.alive() or not b.status()["holders"], message="the slot to free")
        self.assertTrue(b.alive(), f"brokerd died (status {b.proc.returncode}) revoking a plain Acquire")


class SocketActivated(Scenarios, unittest.TestCase):
    """brokerd started by systemd-socket-activate on the first connection, the socket passed as fd 3
    named "varlink"."""
    MODE = "activate"

    def test_listens_on_the_passed_socket(self):
        self.assertIn("Listening on the socket systemd passed", self.broker.log())
        self.assertTrue(os.path.realpath(f"/proc/{self.broker.pid}/exe").endswith("brokerd"))


def accept_blocks_on_passed_socket(b):
    """True when brokerd is stuck in accept4(3, …) on a blocking fd 3."""
    try:
        syscall = harness.read_text(f"/proc/{b.pid}/syscall").split()
        flags = [line for line in harness.read_text(f"/proc/{b.pid}/fdinfo/3").splitlines() if line.startswith("flags:")]
    except OSError:
        return False
    blocking = flags and not int(flags[0].split()[1], 8) & os.O_NONBLOCK
    return syscall[:2] == ["288", "0x3"] and bool(blocking)


class SocketActivation(unittest.TestCase):
    """The socket-activated daemon serves its clients (the scenarios above depend on it). A regression test:
    the fd systemd-socket-activate passes is blocking, and brokerd once hung in accept4() on it."""

    def test_socket_activated_brokerd_serves_clients(self):
        b = Broker(RELOAD_BASE, mode="activate", name="brokerd-activation").start(wait=False)
        self.addCleanup(b.stop)
        try:
            b.wait_ready(timeout=3)
        except AssertionError as e:
            raise AssertionError(f"{e}; stuck in accept4() on a blocking fd 3 (the passed socket): "
                                 f"{accept_blocks_on_passed_socket(b)}")
        for _ in range(3):
            self.assertTrue(b.responsive())


class IdleExit(unittest.TestCase):
    """exit-idle-after= (SPEC §8): under socket activation brokerd exits once nothing is connected or held,
    and not while a lease is held."""

    CONFIG = "[broker]\nexit-idle-after=1s\n[pool p]\nlimit=1\n[lane l]\npools=p\n"

    def test_exits_when_idle_and_not_while_a_lease_is_held(self):
        b = Broker(self.CONFIG, mode="activate", name="brokerd-idle").start()
        self.addCleanup(b.stop)
        holder = b.acquire("l")
        self.assertTrue(holder.granted, holder.msg)
        # A held lease keeps it: still there well past the idle time.
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            self.assertTrue(b.alive(), "brokerd exited while a lease was held")
            time.sleep(0.1)
        holder.close()
        wait_for(lambda: not b.alive(), timeout=5, message="brokerd to exit once idle")
        self.assertEqual(b.proc.returncode, 0, "an idle exit is a clean exit")
        self.assertIn("Idle for 1s: exiting", b.log())

    def test_self_bound_brokerd_never_exits_when_idle(self):
        b = Broker(self.CONFIG, mode="bound", name="brokerd-idle-bound").start()
        self.addCleanup(b.stop)
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            self.assertTrue(b.alive(), "a self-bound brokerd exited when idle: nobody would start it again")
            time.sleep(0.1)


def main_thread_wakeups(pid):
    """Context switches of brokerd's event loop (its main thread) so far."""
    n = 0
    for line in harness.read_text(f"/proc/{pid}/task/{pid}/status").splitlines():
        if "ctxt_switches:" in line:
            n += int(line.split(":")[1])
    return n


class IdleTick(unittest.TestCase):
    """An idle brokerd sleeps: no connection and no lease, its loop does not wake once a second (a fleet of idle
    runners did, each wakeup caches its Redis then missed) nor writes alive marks; a lease makes it tick again."""

    CONFIG = "[pool p]\nlimit=1\n[lane l]\npools=p\n"
    WINDOW = 2.5  # seconds: two ticks and a half of a brokerd that ticks every second

    def quiet_for_a_window(self, b):
        log = os.path.join(b.state_dir, "leases.log")
        before, size = main_thread_wakeups(b.pid), os.path.getsize(log)
        time.sleep(self.WINDOW)  # what is asserted is that nothing happens in it
        return main_thread_wakeups(b.pid) == before and os.path.getsize(log) == size

    def test_an_idle_brokerd_sleeps_and_a_lease_wakes_its_tick(self):
        b = Broker(self.CONFIG, mode="bound", name="brokerd-idle-tick").start()
        self.addCleanup(b.stop)
        wait_for(lambda: self.quiet_for_a_window(b), timeout=20, message="an idle brokerd's loop to sleep")
        holder = b.acquire("l")
        self.assertTrue(holder.granted, holder.msg)
        log = os.path.join(b.state_dir, "leases.log")
        marks = harness.read_text(log).count('{"alive":')
        wakeups = main_thread_wakeups(b.pid)
        # Held: the tick polls the lease's command and marks the log (every 10 s without shared pools).
        wait_for(lambda: main_thread_wakeups(b.pid) >= wakeups + 3, timeout=10, message="ticks while a lease is held")
        wait_for(lambda: harness.read_text(log).count('{"alive":') > marks, timeout=15,
                 message="an alive mark while a lease is held")
        holder.close()
        wait_for(lambda: self.quiet_for_a_window(b), timeout=20, message="the loop to sleep again once idle")
        self.assertTrue(b.responsive())


if __name__ == "__main__":
    (_, VARLINK_FILE), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
