#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""slotctl simulate end to end: SPEC §9's reference figures, §3.1's worked examples, the --json shape,
--sweep, bad inputs and determinism.

Usage: test-simulate.py SLOTCTL SCENARIO_DIR
"""
import json
import os
import select
import stat
import subprocess
import sys
import tempfile
import unittest

SLOTCTL = None
SCENARIOS = None

REFERENCE = ["--limit", "6", "--max-queue", "100", "--hold", "200ms", "--deadline", "30s"]


def simulate(*args, check=True):
    p = subprocess.run([SLOTCTL, "simulate", *args], capture_output=True, text=True, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError(f"slotctl simulate {' '.join(args)} exited {p.returncode}: {p.stderr}")
    return p


def simulate_json(*args):
    return json.loads(simulate(*args, "--json").stdout)


def refused(report):
    return sum(report["refused"].values())


def floor_tenths(ms):
    return ms // 100


class ReferenceFigures(unittest.TestCase):
    """SPEC §9: limit 6, max-queue 100, hold 200 ms, deadline 30 s."""

    def test_25_per_second_nothing_waits(self):
        r = simulate_json(*REFERENCE, "--arrivals", "25/s:60s")
        self.assertEqual(r["requests"], 1500)
        self.assertEqual(refused(r), 0)
        self.assertEqual(max(r["peakQueueBySecond"]), 0)
        self.assertEqual(r["longestWaitMs"], 0)
        self.assertEqual(floor_tenths(r["drainedMs"]), 2)
        self.assertIsNone(r["firstRefusalMs"])
        text = simulate(*REFERENCE, "--arrivals", "25/s:60s").stdout
        self.assertIn("drained          0.2 s after the last arrival", text)
        self.assertIn("first refusal   none", text)

    def test_40_per_second_fills_the_queue(self):
        r = simulate_json(*REFERENCE, "--arrivals", "40/s:60s")
        peaks = r["peakQueueBySecond"]
        self.assertEqual([peaks[4], peaks[19], peaks[39], peaks[59]], [50, 100, 100, 100])
        self.assertEqual(r["requests"], 2400)
        self.assertEqual(refused(r), 500)
        self.assertEqual(r["refused"]["full"], 500)
        self.assertEqual(r["late"], 0)
        self.assertEqual(floor_tenths(r["firstRefusalMs"]), 100)
        self.assertEqual(floor_tenths(r["longestWaitMs"]), 33)
        self.assertEqual(floor_tenths(r["drainedMs"]), 35)
        text = simulate(*REFERENCE, "--arrivals", "40/s:60s").stdout
        self.assertIn("first refusal   10.0 s", text)
        self.assertIn("longest wait     3.3 s", text)
        self.assertIn("drained          3.5 s after the last arrival", text)
        self.assertIn("refused          500", text)

    def test_burst_then_steady(self):
        r = simulate_json(*REFERENCE, "--arrivals", "200/s:1s,20/s:59s")
        peaks = r["peakQueueBySecond"]
        self.assertEqual([peaks[4], peaks[19], peaks[39], peaks[59]], [69, 0, 0, 0])
        self.assertEqual(r["requests"], 1380)
        self.assertEqual(refused(r), 71)
        self.assertEqual(floor_tenths(r["firstRefusalMs"]), 5)
        self.assertEqual(floor_tenths(r["longestWaitMs"]), 33)
        text = simulate(*REFERENCE, "--arrivals", "200/s:1s,20/s:59s").stdout
        self.assertIn("first refusal    0.5 s", text)
        self.assertIn("longest wait     3.3 s", text)

    def test_peak_queue_covers_every_second_until_the_end(self):
        r = simulate_json(*REFERENCE, "--arrivals", "40/s:60s")
        # The last arrival is at 59975 ms; the queue of 100 drains in 3.33 s, the last hold ends 200 ms later.
        self.assertEqual(len(r["peakQueueBySecond"]), 64)
        self.assertEqual(r["peakQueueBySecond"][-1], 9)


    def test_peak_queue_counts_an_instant_once_settled(self):
        """A lease that max-hold revokes, or a hold of 0, ends in a second pass of its instant, which hands its
        slot to a waiter: the instant settles with nobody waiting, and that is what its second counts."""
        cases = [
            # A holds from 0 until max-hold revokes it at 1 s; B waits from 0.5 s and is granted at 1 s.
            ({"pool": {"limit": 1}, "lanes": {"l": {"pools": ["default"], "max-hold": "1s"}},
              "requests": [{"name": "A", "at": "0s", "hold": "forever"},
                           {"name": "B", "at": "500ms", "hold": "1500ms"}]},
             [1, 0, 0]),
            # A at 1 s holds 0 ms; B arrives at the same instant, queues behind it and is granted then.
            ({"pool": {"limit": 1},
              "requests": [{"name": "A", "at": "1s", "hold": "0"}, {"name": "B", "at": "1s", "hold": "1s"}]},
             [0, 0, 0]),
        ]
        with tempfile.TemporaryDirectory() as tmp:
            for i, (scenario, peaks) in enumerate(cases):
                path = os.path.join(tmp, f"{i}.json")
                with open(path, "w") as f:
                    json.dump(scenario, f)
                with self.subTest(scenario=scenario):
                    r = simulate_json("--scenario", path)
                    self.assertEqual(r["granted"], 2)
                    self.assertEqual(r["peakQueueBySecond"], peaks)


class WorkedExamples(unittest.TestCase):
    """SPEC §3.1, Q = 5m (fast 15 s, saturated budget 30 s), limit 2."""

    def requests(self, name):
        r = simulate_json("--scenario", os.path.join(SCENARIOS, name))
        return {q["name"]: q for q in r["perRequest"]}, r

    def test_reservation_ahead_of_a_two_slot_waiter(self):
        """SPEC §3.6: a reservation goes ahead of the k=2 waiter that came first, its lease ends after its for."""
        q, r = self.requests("reserve.json")
        self.assertEqual(r["reservations"], {"count": 2, "granted": 2, "refused": 0, "longestWaitMs": 300})
        self.assertEqual(q["pair"]["decidedMs"], 1700)
        self.assertEqual(r["requests"], 5)
        text = simulate("--scenario", os.path.join(SCENARIOS, "reserve.json")).stdout
        self.assertIn("reservations       2  (granted 2, longest wait 0.3 s)\n", text)
        self.assertNotIn("reservations", simulate("--scenario", os.path.join(SCENARIOS, "jammed.json")).stdout)

    def test_keeping_up(self):
        q, r = self.requests("keeping-up.json")
        self.assertEqual([q["A"]["outcome"], q["B"]["outcome"]], ["granted", "granted"])
        self.assertEqual(q["A"]["decidedMs"], 0)
        c = q["C"]
        self.assertEqual(c["arrivedMs"], 4000)
        self.assertEqual(c["state"], "keeping-up")
        self.assertEqual(c["idleMs"], 4000)
        self.assertEqual(c["budgetMs"], 300000)
        self.assertEqual(c["outcome"], "granted")
        self.assertEqual(c["decidedMs"], 9000)
        self.assertEqual(c["waitedMs"], 5000)
        d = q["D"]
        self.assertEqual(d["arrivedMs"], 120000)
        self.assertEqual(d["state"], "keeping-up")
        self.assertEqual(d["idleMs"], 111000)  # C's fast grant at 9 s reset idle
        self.assertEqual(d["budgetMs"], 300000)
        self.assertIsNone(r["drainedMs"])  # B and C hold forever

    def test_jammed(self):
        q, r = self.requests("jammed.json")
        c = q["C"]
        self.assertEqual(c["arrivedMs"], 10000)
        self.assertEqual(c["state"], "keeping-up")
        self.assertEqual(c["budgetMs"], 300000)
        self.assertEqual(c["outcome"], "timeout")
        self.assertEqual(c["decidedMs"], 310000)
        self.assertIsNone(c["waitedMs"])
        d = q["D"]
        self.assertEqual(d["arrivedMs"], 311000)
        self.assertEqual(d["state"], "saturated")
        self.assertEqual(d["idleMs"], 311000)
        self.assertEqual(d["budgetMs"], 30000)
        self.assertEqual(d["outcome"], "shed")
        self.assertEqual(d["decidedMs"], 341000)
        self.assertEqual(r["refused"], {"busy": 0, "full": 0, "timeout": 1, "shed": 1})
        self.assertEqual(r["firstRefusalMs"], 310000)

    def test_text_report_has_a_row_per_request(self):
        text = simulate("--scenario", os.path.join(SCENARIOS, "jammed.json")).stdout
        rows = {line.split()[0]: line.split() for line in text.splitlines() if line[:2] in ("A ", "B ", "C ", "D ")}
        self.assertEqual(sorted(rows), ["A", "B", "C", "D"])
        self.assertIn("saturated", rows["D"])
        self.assertIn("shed", rows["D"])
        self.assertIn("341.0", rows["D"])


class JsonShape(unittest.TestCase):
    TOP = {"requests": int, "granted": int, "refused": dict, "late": int, "peakQueueBySecond": list,
           "firstRefusalMs": (int, type(None)), "longestWaitMs": int, "drainedMs": (int, type(None)),
           "perRequest": list}
    RECORD = {"name": str, "arrivedMs": int, "pool": str, "state": (str, type(None)),
              "idleMs": (int, type(None)), "budgetMs": (int, type(None)), "outcome": (str, type(None)),
              "decidedMs": (int, type(None)), "waitedMs": (int, type(None))}

    def check_types(self, obj, shape):
        self.assertEqual(set(obj), set(shape))
        for key, kind in shape.items():
            self.assertIsInstance(obj[key], kind, key)
            self.assertNotIsInstance(obj[key], bool, key)

    def test_summary_fields(self):
        r = simulate_json(*REFERENCE, "--arrivals", "40/s:60s")
        self.check_types(r, self.TOP)
        self.assertEqual(set(r["refused"]), {"busy", "full", "timeout", "shed"})
        self.assertTrue(all(isinstance(v, int) for v in r["peakQueueBySecond"]))
        self.assertEqual(r["perRequest"], [])  # generated requests only with --per-request
        self.assertEqual(r["granted"] + refused(r), r["requests"])

    def test_per_request_fields(self):
        r = simulate_json(*REFERENCE, "--arrivals", "40/s:20s", "--per-request")
        self.assertEqual(len(r["perRequest"]), r["requests"])
        self.assertEqual([q["name"] for q in r["perRequest"][:3]], ["1", "2", "3"])
        outcomes = set()
        for q in r["perRequest"]:
            self.check_types(q, self.RECORD)
            outcomes.add(q["outcome"])
            if q["outcome"] == "granted":
                self.assertEqual(q["decidedMs"] - q["arrivedMs"], q["waitedMs"])
            else:
                self.assertIsNone(q["waitedMs"])
        self.assertEqual(outcomes, {"granted", "full"})

    def test_explicit_requests_always_reported(self):
        for name in ("keeping-up.json", "jammed.json"):
            r = simulate_json("--scenario", os.path.join(SCENARIOS, name))
            self.assertEqual([q["name"] for q in r["perRequest"]], ["A", "B", "C", "D"])
            for q in r["perRequest"]:
                self.check_types(q, self.RECORD)


class Sweep(unittest.TestCase):
    KEYS = {"value", "requests", "granted", "busy", "full", "timeout", "shed", "late", "longestWaitMs", "peakQueue"}

    def test_limit_rows(self):
        rows = simulate_json(*REFERENCE, "--arrivals", "40/s:60s", "--sweep", "limit=6..10")
        self.assertEqual([row["value"] for row in rows], [6, 7, 8, 9, 10])
        for row in rows:
            self.assertEqual(set(row), self.KEYS)
            self.assertEqual(row["requests"], 2400)
        first = rows[0]
        self.assertEqual((first["full"], first["peakQueue"], first["longestWaitMs"] // 100), (500, 100, 33))
        # More slots never refuse more, nor wait longer, in the 40/s case.
        refusals = [row["busy"] + row["full"] + row["timeout"] + row["shed"] for row in rows]
        self.assertEqual(refusals, sorted(refusals, reverse=True))
        waits = [row["longestWaitMs"] for row in rows]
        self.assertEqual(waits, sorted(waits, reverse=True))
        self.assertEqual(rows[-1]["granted"], 2400)

    def test_sweep_of_the_limit_needs_no_limit(self):
        # The sweep gives the limit: the command-line form needs no --limit, as the --replay form.
        rows = simulate_json("--hold", "200ms", "--arrivals", "40/s:10s", "--sweep", "limit=6..8")
        self.assertEqual([row["value"] for row in rows], [6, 7, 8])
        self.assertEqual([row["requests"] for row in rows], [400] * 3)
        # Any other sweep still needs it.
        p = simulate("--hold", "200ms", "--arrivals", "40/s:10s", "--sweep", "max-queue=0..2", check=False)
        self.assertEqual(p.returncode, 64)
        self.assertIn("--limit is missing", p.stderr)

    def test_text_has_a_row_per_value(self):
        text = simulate(*REFERENCE, "--arrivals", "40/s:60s", "--sweep", "limit=6..10").stdout
        lines = text.strip().splitlines()
        self.assertTrue(lines[0].split()[0] == "limit")
        self.assertEqual([line.split()[0] for line in lines[1:]], ["6", "7", "8", "9", "10"])

    def test_other_keys(self):
        rows = simulate_json(*REFERENCE, "--arrivals", "40/s:60s", "--sweep", "max-queue=0..2")
        self.assertEqual([row["peakQueue"] for row in rows], [0, 1, 2])
        rows = simulate_json("--limit", "2", "--hold", "1s", "--arrivals", "3/s:20s", "--queue-timeout", "1s",
                             "--sweep", "queue-timeout=1..3")
        self.assertEqual(len(rows), 3)

    def test_sweep_of_a_scenario(self):
        rows = simulate_json("--scenario", os.path.join(SCENARIOS, "jammed.json"), "--sweep", "limit=2..4")
        self.assertEqual([row["shed"] + row["timeout"] for row in rows], [2, 0, 0])


class BadInput(unittest.TestCase):
    def expect_usage_error(self, args, culprit):
        p = simulate(*args, check=False)
        self.assertEqual(p.returncode, 64, f"{args}: {p.stderr}")
        self.assertEqual(p.stdout, "", args)
        self.assertIn(culprit, p.stderr, args)

    def test_command_line(self):
        cases = [
            (["--limit", "6", "--hold", "200ms", "--arrivals", "-4/s:10s"], 'invalid rate "-4/s"'),
            (["--limit", "6", "--hold", "200ms", "--arrivals", "40/s"], 'invalid phase "40/s"'),
            (["--limit", "6", "--hold", "200ms", "--arrivals", "40/s:1x"], 'invalid duration "1x"'),
            (["--limit", "6", "--hold", "soon", "--arrivals", "40/s:10s"], "--hold"),
            (["--limit", "6", "--hold", "1500us", "--arrivals", "40/s:10s"], "whole milliseconds"),
            (["--limit", "zero", "--hold", "1s", "--arrivals", "40/s:10s"], "--limit"),
            (["--limit", "0", "--hold", "1s", "--arrivals", "40/s:10s"], "--limit"),
            (["--limit", "6", "--max-queue", "-1", "--hold", "1s", "--arrivals", "40/s:10s"], "--max-queue"),
            (["--limit", "6", "--queue-timeout", "5m", "--queue-congestion-timeout", "10m", "--hold", "1s",
              "--arrivals", "4/s:10s"], "queue-congestion-timeout"),
            (["--limit", "6", "--hold", "1s"], "--arrivals"),
            (["--hold", "1s", "--arrivals", "4/s:1s"], "--limit"),
            (["--limit", "6", "--hold", "1s", "--arrivals", "4/s:1s", "--frobnicate"], "--frobnicate"),
            (["--limit", "6", "--hold", "1s", "--arrivals", "4/s:1s", "--sweep", "colour=1..2"], "colour"),
            (["--limit", "6", "--hold", "1s", "--arrivals", "4/s:1s", "--sweep", "limit=9..6"], "9..6"),
            (["--limit", "6", "--hold", "1s", "--arrivals", "4/s:1s", "--sweep", "limit=0..2"], "limit=0"),
            (["--limit", "6", "--hold", "1s", "--arrivals", "4/s:1s", "--seed", "x"], "--seed"),
            (["--limit", "6", "--hold", "1s", "--arrivals", "4/s:1s", "stray"], "stray"),
            (["--scenario", "/nonexistent/scenario.json"], "/nonexistent/scenario.json"),
            (["--scenario", SCENARIOS], f"{SCENARIOS}: Is a directory"),
            (["--scenario", os.path.join(SCENARIOS, "jammed.json"), "--limit", "3"], "--limit"),
        ]
        for args, culprit in cases:
            with self.subTest(args=args):
                self.expect_usage_error(args, culprit)

    def test_scenario_files(self):
        cases = [
            ('{"pool": {"limit": 2}, "arrivals": [{"rate": "-4/s", "for": "1s", "hold": "1s"}]}',
             'arrivals[0].rate: invalid rate "-4/s"'),
            ('{"pool": {"limit": 2}, "arrivals": [{"rate": "4/s", "for": "ten", "hold": "1s"}]}',
             'arrivals[0].for: invalid duration "ten"'),
            ('{"pool": {"limit": 2}, "arrivals": [{"rate": "4/s", "for": "1s", "hold": "1s", "colour": 1}]}',
             "arrivals[0].colour: unknown key"),
            ('{"pool": {"limit": true}}', "pool.limit: expected an integer, got a boolean"),
            ('{"pool": {"limit": "two"}}', 'pool.limit: invalid number "two"'),
            ('{"pool": {"limit": 2, "max-queue": "none"}}', 'pool.max-queue: invalid number "none"'),
            ('{"pool": {"limit": 2, "queue-timeout": 300}}', "pool.queue-timeout: expected a string"),
            ('{"pool": {"limit": 2}, "requests": [{"name": "A", "at": "1s", "hold": "1s", "lane": "merge"}]}',
             'requests[0].lane: unknown lane "merge"'),
            ('{"pools": {"a": {"limit": 1}}, "lanes": {"m": {"pools": ["b"]}}}', 'lanes.m.pools[0]: unknown pool "b"'),
            ('{"pools": {"a": {"limit": 1}}, "lanes": {"m": {"pools": ["a"], "policy": "sometimes"}}}',
             "lanes.m.policy"),
            ('{"pool": {"limit": 2}, "requests": [{"name": "A", "at": "0s", "hold": "1s", "slots": 3}]}',
             "requests[0].slots"),
            ('{"pool": {"limit": 2}, "unexpected": []}', "unexpected: unknown key"),
            ('{"pool": {"members": ["a"]}, "reservations": [{"at": "0s", "pool": "default", "member": "b", '
             '"for": "1s", "reason": "x"}]}', 'reservations[0].member: pool "default" has no member "b"'),
            ('{"pool": {"limit": 2}, "reservations": [{"at": "0s", "pool": "default", "for": "1s"}]}',
             "reservations[0].reason: missing"),
            ('{"pool": {"limit": 2}, "arrivals": [', "invalid JSON"),
            ("", "invalid JSON"),
        ]
        with tempfile.TemporaryDirectory() as tmp:
            for i, (text, culprit) in enumerate(cases):
                path = os.path.join(tmp, f"bad-{i}.json")
                with open(path, "w") as f:
                    f.write(text)
                with self.subTest(scenario=text):
                    self.expect_usage_error(["--scenario", path], f"bad-{i}.json")
                    self.expect_usage_error(["--scenario", path], culprit)

    def test_an_instant_of_many_arrivals_in_bounded_memory(self):
        """3,000,000 arrivals in one millisecond, all but 11 refused full: each one's events are handled as
        it comes (they piled up until the instant ended: 755 MB and 16 s, against 2 MB spread over a second)."""
        measure = ("import resource, subprocess, sys\n"
                   "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
                   "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, p.stdout)")
        # Under ASan, freed memory waits in its quarantine (256 MB by default) before reuse: off, so that the
        # peak is the program's (20 MB then; other builds ignore the variable).
        asan = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS", ""), "quarantine_size_mb=0"]))
        p = subprocess.run([sys.executable, "-c", measure, SLOTCTL, "simulate", "--limit", "1", "--max-queue", "10",
                            "--hold", "1s", "--arrivals", "3000000000/s:1ms", "--json"],
                           capture_output=True, text=True, timeout=120, check=True,
                           env=dict(os.environ, ASAN_OPTIONS=asan))
        code, maxrss_kib, out = p.stdout.split(" ", 2)
        self.assertEqual(int(code), 0)
        r = json.loads(out)
        self.assertEqual((r["requests"], r["granted"], r["refused"]["full"]), (3000000, 11, 2999989))
        self.assertLess(int(maxrss_kib), 100 * 1024)

    def test_waiting_is_bounded(self):
        """No brokerd keeps more waiters than max-connections= allows (1048576 at most): a run that would is
        refused, rather than growing memory with every waiter (2,000,000 in one instant here)."""
        p = simulate("--limit", "1", "--hold", "1s", "--arrivals", "2000000000/s:1ms", check=False)
        self.assertEqual(p.returncode, 64, p.stderr)
        self.assertEqual(p.stdout, "")
        self.assertIn("more than 1048576 requests wait at once", p.stderr)

    def test_virtual_time_is_bounded(self):
        """The report keeps the queue's peak of every simulated second: a run covers at most 366 days, and
        what would take it further is refused (it once grew memory for ever: --arrivals 1/s:100y)."""
        base = ["--limit", "1"]
        cases = [
            ([*base, "--hold", "1s", "--arrivals", "1/s:100y"], '--arrivals: "100y" is longer than 366d'),
            ([*base, "--hold", "400d", "--arrivals", "1/s:1s"], '--hold: "400d" is longer than 366d'),
            ([*base, "--hold", "1s", "--arrivals", "1/s:200d,0/s:200d"], "--arrivals: the phases last longer than 366d"),
            ([*base, "--hold", "1s", "--arrivals", "1/s:1s", "--deadline", "1000y"], '--deadline: "1000y"'),
            # Each value in bounds, but the second request waits 300 days and holds 300 more.
            ([*base, "--hold", "300d", "--arrivals", "1/s:2s"], "runs past 366d of virtual time"),
            ([*base, "--hold", "300d", "--arrivals", "1/s:2s", "--sweep", "limit=1..2"], "runs past 366d"),
        ]
        for args, culprit in cases:
            with self.subTest(args=args):
                self.expect_usage_error(args, culprit)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "long.json")
            with open(path, "w") as f:
                f.write('{"pool": {"limit": 1}, "requests": [{"name": "A", "at": "367d", "hold": "1s"}]}')
            self.expect_usage_error(["--scenario", path], 'requests[0].at: "367d" is longer than 366d')
        # A long run within the bound is fine, and a forever hold is no span at all.
        r = simulate_json(*base, "--hold", "forever", "--arrivals", "1/s:2s")
        self.assertEqual((r["requests"], r["granted"]), (2, 1))
        r = simulate_json(*base, "--hold", "30d", "--arrivals", "1/s:1s")
        self.assertEqual(r["granted"], 1)
        self.assertEqual(len(r["peakQueueBySecond"]), 30 * 86400 + 1)


class Determinism(unittest.TestCase):
    def test_same_seed_same_output(self):
        args = [*REFERENCE, "--arrivals", "200/s:1s,20/s:59s", "--queue-timeout", "2s", "--per-request", "--json"]
        a = simulate(*args, "--seed", "7").stdout
        b = simulate(*args, "--seed", "7").stdout
        self.assertEqual(a, b)
        self.assertEqual(json.loads(a)["requests"], 1380)

    def test_text_is_stable(self):
        args = ["--scenario", os.path.join(SCENARIOS, "keeping-up.json")]
        self.assertEqual(simulate(*args).stdout, simulate(*args).stdout)


class Output(unittest.TestCase):
    ARGS = ["--limit", "2", "--hold", "2s", "--arrivals", "2/s:5s"]

    def test_html_through_a_symlink_fifo_or_device(self):
        """--html replaces a regular file by renaming a complete page over it; anything else is written
        through, as `>` would: renaming over /dev/null as root replaced the device by a file."""
        with tempfile.TemporaryDirectory() as tmp:
            target, link = os.path.join(tmp, "target.html"), os.path.join(tmp, "link.html")
            with open(target, "w") as f:
                f.write("old")
            os.symlink("target.html", link)
            simulate(*self.ARGS, "--html", link)
            self.assertTrue(os.path.islink(link), "the symlink was replaced")
            with open(target) as f:
                self.assertTrue(f.read().startswith("<!DOCTYPE html>"))

            fifo = os.path.join(tmp, "fifo")
            os.mkfifo(fifo)
            reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            page = b""
            try:
                p = subprocess.Popen([SLOTCTL, "simulate", *self.ARGS, "--html", fifo], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
                while True:
                    done = p.poll() is not None
                    ready, _, _ = select.select([reader], [], [], 0.1)
                    if ready:
                        chunk = os.read(reader, 65536)
                        page += chunk
                        if chunk:
                            continue
                    if done:
                        break
                self.assertEqual(p.wait(), 0, p.stderr.read())
            finally:
                os.close(reader)
            self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced")
            self.assertTrue(page.startswith(b"<!DOCTYPE html>") and page.rstrip().endswith(b"</html>"), page[:80])

            # A device node of our own (as root only), never the machine's /dev/null.
            if os.geteuid() == 0:
                null = os.path.join(tmp, "null")
                os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
                simulate(*self.ARGS, "--html", null)
                self.assertTrue(stat.S_ISCHR(os.lstat(null).st_mode), "the device was replaced")
                full = os.path.join(tmp, "full")
                os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
                p = simulate(*self.ARGS, "--html", full, check=False)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn("No space left on device", p.stderr)
                self.assertTrue(stat.S_ISCHR(os.lstat(full).st_mode), "the device was replaced")

    def test_same_output_whatever_the_locale_and_zone(self):
        """The virtual clock has no time zone: the report and the page are the same bytes under any TZ and
        locale (the page's title once gave the run's start as a 1970 date in local time)."""
        with tempfile.TemporaryDirectory() as tmp:
            runs = []
            for i, env in enumerate([{"TZ": "UTC", "LC_ALL": "C"}, {"TZ": "Asia/Tokyo", "LC_ALL": "de_DE.UTF-8"},
                                     {"TZ": "America/New_York", "LANG": "fr_FR.UTF-8"}]):
                page = os.path.join(tmp, f"{i}.html")
                p = subprocess.run([SLOTCTL, "simulate", *self.ARGS, "--per-request", "--html", page],
                                   env={**os.environ, **env}, capture_output=True, check=True)
                with open(page, "rb") as f:
                    runs.append((p.stdout, f.read()))
            for run in runs[1:]:
                self.assertEqual(run[0], runs[0][0])
                self.assertEqual(run[1], runs[0][1])

    def test_report_to_a_full_or_closed_stdout(self):
        """A report that cannot be written is an error (exit 1), never a silent 0."""
        for args in ([], ["--json"], ["--sweep", "limit=1..3"]):
            with self.subTest(args=args), open("/dev/full", "w") as full:
                p = subprocess.run([SLOTCTL, "simulate", *self.ARGS, *args], stdout=full, stderr=subprocess.PIPE,
                                   text=True)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertIn("No space left on device", p.stderr)
        p = subprocess.run([SLOTCTL, "simulate", *self.ARGS], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, pass_fds=(), preexec_fn=lambda: os.close(1))
        self.assertEqual(p.returncode, 1, p.stderr)


class Cli(unittest.TestCase):
    def test_help_and_version(self):
        self.assertEqual(subprocess.run([SLOTCTL, "--help"], capture_output=True).returncode, 0)
        self.assertEqual(subprocess.run([SLOTCTL, "simulate", "--help"], capture_output=True).returncode, 0)
        p = subprocess.run([SLOTCTL, "--version"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0)
        self.assertTrue(p.stdout.startswith("slotctl "))

    def test_usage_errors_exit_64(self):
        for args in ([], ["frobnicate"], ["--frobnicate"]):
            p = subprocess.run([SLOTCTL, *args], capture_output=True, text=True)
            self.assertEqual(p.returncode, 64, args)
            self.assertEqual(p.stdout, "")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    SLOTCTL, SCENARIOS = sys.argv[1], sys.argv[2]
    unittest.main(argv=[sys.argv[0], *sys.argv[3:]], verbosity=2)
