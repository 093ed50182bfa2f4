#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""slotctl report: a history.db filled through the real brokerd with a known sequence (grants, a wait, busy,
full and timeout refusals, a revocation), drawn as HTML whose charts and figures must say what
`slotctl history --json` says. When Debian's chromium is installed, the page is also loaded in it headless:
--dump-dom must show the same charts and figures, --screenshot a non-blank image of the window's size
(skipped, not passed, without chromium). Bad input: a missing file, another program's file, a newer schema,
an empty history, a pool that never had an event.

Usage: test-report.py BROKERD SLOTCTL [unittest arguments]
"""
import html.parser
import json
import os
import re
import select
import shutil
import sqlite3
import stat
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import zlib

sys.dont_write_bytecode = True
import harness  # noqa: E402
from harness import wait_for  # noqa: E402

SLOTCTL = None
CHROMIUM = shutil.which("chromium")
REASONS = ("busy", "full", "timeout", "shed", "unavailable")
ENV = dict(os.environ, TZ="UTC")

CONFIG = """\
[pool grid]
limit = 1
max-queue = 2
queue-timeout = 5m

[pool idle]
limit = 1

[lane merge]
pools = grid
policy = fail-fast

[lane nightly]
pools = grid
policy = wait

[lane short]
pools = grid
policy = fail-fast
max-hold = 1s

[lane spare]
pools = idle
"""

# Rigs with labels (SPEC §3.5), for the table per label set.
RIGS_CONFIG = """\
[pool rigs]
members = a b c
label.arm64 = a b
label.usb3 = b c

[lane ff]
pools = rigs
policy = fail-fast

[lane w]
pools = rigs
policy = wait
"""

# Rigs that a job's exit status quarantines (SPEC §3.6), for the table and chart per member.
LIFE_CONFIG = """\
[pool life]
members = a b
quarantine-exit-codes = 3
admin-users = {admin}

[lane w]
pools = life
policy = wait
"""


class Page(html.parser.HTMLParser):
    """What the tests read of a report: per pool its figures and, per chart, the count of its bars, points
    and series; the page's summaries; anything that would load from elsewhere."""

    def __init__(self, text):
        super().__init__()
        self.pools = {}          # name -> {"figures": {…}, "charts": {chart: {"bars": n, "points": n, …}}}
        self.summaries = 0
        self.fetches = []        # src=, href=, <script>, <link>
        self._pool = None
        self._chart = None
        self._figure = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "link", "iframe", "img", "object", "embed") or "src" in a or "href" in a:
            self.fetches.append((tag, attrs))
        if tag == "section" and "data-pool" in a:
            self._pool = self.pools.setdefault(a["data-pool"], {"figures": {}, "charts": {}})
        if tag == "p" and "summary" in (a.get("class") or "").split():
            self.summaries += 1
        if tag == "svg" and a.get("class") == "chart" and self._pool is not None:
            self._chart = self._pool["charts"].setdefault(a["data-chart"], {"bars": 0, "points": 0, "series": 0,
                                                                             "congested": 0, "n": 0})
            self._chart["n"] += 1
        if self._chart is not None:
            for cls, key in (("bar", "bars"), ("point", "points"), ("series", "series"), ("congested", "congested")):
                if a.get("class") == cls:
                    self._chart[key] += 1
        if tag == "rect" and "data-limit" in a and self._pool is not None:
            self._pool.setdefault("capacity", {})[int(a["data-limit"])] = (int(a["data-count"]), int(a["data-longest-ms"]))
        if tag == "span" and "data-figure" in a:
            self._figure = a
        if tag == "tr" and "data-member" in a and self._pool is not None:
            self._pool.setdefault("members", {})[a["data-member"]] = {
                k[5:]: (float(v) if k == "data-use" else int(v)) for k, v in a.items()
                if k.startswith("data-") and k != "data-member"}
        if tag == "tr" and "data-selector" in a and self._pool is not None:
            self._pool.setdefault("selectors", {})[a["data-selector"]] = {
                k[5:]: int(v) for k, v in a.items() if k.startswith("data-") and k != "data-selector"}

    def handle_data(self, data):
        if self._figure is not None and self._pool is not None:
            self._pool["figures"].setdefault(self._figure["data-figure"],
                                             int(self._figure["data-ms"]) if "data-ms" in self._figure else int(data))
            self._figure = None

    def handle_endtag(self, tag):
        if tag == "svg":
            self._chart = None
        if tag == "section":
            self._pool = None
        if tag == "span":
            self._figure = None


def png_size_and_colours(path):
    """(width, height) from the IHDR, and how many distinct byte values the decompressed pixel rows hold: a
    blank page has a handful (one colour and the filter bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, size = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return size, len(set(zlib.decompress(idat)))


def slotctl(*args, check=True):
    p = subprocess.run([SLOTCTL, *args], capture_output=True, text=True, timeout=120, env=ENV,
                       stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise AssertionError(f"slotctl {' '.join(args)} exited {p.returncode}: {p.stderr}")
    return p


def history_schema(path, version=4, application_id=0x534c4f54):
    db = sqlite3.connect(path)
    db.executescript(f"""
        PRAGMA application_id = {application_id};
        CREATE TABLE events (id INTEGER PRIMARY KEY, time INTEGER NOT NULL, decision TEXT NOT NULL,
          pool TEXT, lane TEXT, job TEXT, lease TEXT, token INTEGER, wait_us INTEGER, hold_us INTEGER,
          budget_us INTEGER, idle_us INTEGER, state TEXT, uid INTEGER, pid INTEGER, retry_after_sec INTEGER,
          reason TEXT);
        CREATE INDEX events_time ON events(time);
        PRAGMA user_version = {version};""")
    return db


class Report(harness.BrokerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="test-report-")
        cls.events, cls.history = cls.fill_history()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def fill_history(cls):
        """The known sequence, through brokerd; returns what `slotctl history --json` says of it and the
        database, copied once brokerd has stopped (it keeps history.db locked for itself while it runs)."""
        b = harness.Broker(CONFIG, name="report").start()
        try:
            a = b.acquire("merge")
            a.until_granted()
            busy = b.acquire("merge")                             # busy: merge fails fast
            assert busy.error == "io.slotbroker.Busy", busy.msg
            busy.close()
            waiter = b.acquire("nightly")                         # waits…
            assert waiter.queued, waiter.msg
            late = b.acquire("nightly", queueWaitMs=300)          # …and this one too, for 300 ms at most
            assert late.queued, late.msg
            full = b.acquire("nightly")                           # the queue (max-queue 2) is full
            assert full.error == "io.slotbroker.QueueFull", full.msg
            full.close()
            late.until(lambda x: x.error, 10, "the timeout")
            assert late.error == "io.slotbroker.QueueTimeout", late.msg
            late.close()
            a.close()                                             # the first waiter is granted, ≥ 300 ms on
            waiter.until_granted()
            waiter.close()
            b.wait_idle()
            short = b.acquire("short")                            # revoked after max-hold = 1s
            short.until_granted()
            short.until(lambda x: x.state == "revoked" or x.error, 10, "the revocation")
            short.close()
            b.wait_idle()

            def history():
                p = slotctl("history", "--json", "--socket", b.socket_path)
                events = json.loads(p.stdout)["events"]
                released = [e for e in events if e["decision"] == "released"]
                return events if len(released) >= 3 else None
            events = wait_for(history, 10, message="every decision in the history")
        finally:
            status = b.stop()
        assert status == 0, f"brokerd exited {status}: {b.log()[-2000:]}"
        path = os.path.join(cls.dir, "history.db")
        shutil.copy(os.path.join(b.state_dir, "history.db"), path)
        b.cleanup()
        return events, path

    def report(self, *args, history=None, check=True):
        out = os.path.join(self.dir, f"{self.id().rsplit('.', 1)[-1]}.html")
        p = slotctl("report", "--history", history or self.history, "-o", out, *args, check=check)
        if p.returncode != 0:
            return p, None
        with open(out) as f:
            return p, f.read()

    def expected(self, pool):
        """The figures `slotctl history --json` gives for a pool."""
        events = [e for e in self.events if e.get("pool") == pool]
        grants = [e for e in events if e["decision"] == "granted"]
        figures = {r: sum(e["decision"] == r for e in events) for r in REASONS}
        figures["refused"] = sum(figures.values())
        figures["granted"] = len(grants)
        figures["longest-wait"] = max(e.get("waitedMs", 0) for e in grants)
        figures["revocations"] = sum(e["decision"] in ("revoked", "overdue") for e in self.events)
        hours = {(e["time"] // 3_600_000_000, e["decision"]) for e in events if e["decision"] in REASONS}
        return figures, len(hours)

    def check_page(self, page):
        figures, bars = self.expected("grid")
        self.assertEqual(figures["granted"], 3)
        self.assertEqual((figures["busy"], figures["full"], figures["timeout"]), (1, 1, 1))
        self.assertGreaterEqual(figures["longest-wait"], 300)
        self.assertEqual(figures["revocations"], 1)

        self.assertEqual(list(page.pools), ["grid"])
        grid = page.pools["grid"]
        for name in ("granted", "refused", *REASONS, "longest-wait"):
            self.assertEqual(grid["figures"].get(name), figures[name], f"figure {name}")
        self.assertEqual(grid["figures"]["peak-in-use"], 1)
        self.assertEqual(grid["figures"]["peak-waiting"], 2)  # the first waiter and the one refused at 300 ms
        charts = grid["charts"]
        self.assertEqual(charts["timeline"]["series"], 2)             # in use, waiting
        self.assertEqual(charts["refusals"]["bars"], bars)            # one per (hour, reason) with refusals
        self.assertEqual(charts["waits"]["n"], 3)                     # merge, nightly, short
        self.assertGreaterEqual(charts["waits"]["points"], 3 * 3)     # p50, p95, max per lane and hour
        self.assertEqual(charts["wait-histogram"]["n"], 1)
        self.assertEqual(page.fetches, [])
        self.assertGreaterEqual(page.summaries, 5)

    def test_report_says_what_history_says(self):
        p, text = self.report()
        self.assertEqual(p.stderr, "")
        self.check_page(Page(text))
        self.assertIn('<span data-figure="revocations">1</span>', text)
        self.assertIn("max-hold", text)

    def test_replay_sweep_is_simulate_replay_sweep(self):
        _, text = self.report("--replay-sweep", "limit=1..3")
        capacity = Page(text).pools["grid"]["capacity"]
        p = slotctl("simulate", "--replay", self.history, "--pool", "grid", "--sweep", "limit=1..3", "--json")
        rows = json.loads(p.stdout)
        self.assertEqual(capacity, {r["value"]: (sum(r[k] for k in REASONS if k in r), r["longestWaitMs"]) for r in rows})
        self.assertEqual(Page(text).pools["grid"]["charts"]["capacity"]["bars"], 3)

        p = slotctl("report", "--history", self.history, "-o", "-", "--replay-sweep", "limit=0..3", check=False)
        self.assertEqual(p.returncode, 64)
        p = slotctl("report", "--history", self.history, "-o", "-", "--replay-sweep", "queue-timeout=1..3", check=False)
        self.assertEqual(p.returncode, 64)

    def test_simulate_html_draws_the_simulated_run(self):
        """SPEC §9's reference run drawn: the page's figures are the simulator's own."""
        args = ["simulate", "--limit", "6", "--max-queue", "100", "--hold", "200ms", "--arrivals", "40/s:60s",
                "--deadline", "30s", "--queue-timeout", "5s"]
        out = os.path.join(self.dir, "simulate.html")
        text_run = slotctl(*args).stdout
        self.assertEqual(slotctl(*args, "--html", out).stdout, text_run)  # the text report is unchanged
        sim = json.loads(slotctl(*args, "--json").stdout)
        with open(out) as f:
            raw = f.read()
            page = Page(raw)
        figures = page.pools["default"]["figures"]
        # The tables say what the run did: its longest holds (every one 200 ms) and its refusals by traffic,
        # never "no lease ended" under a summary of thousands of released leases.
        self.assertFalse("No lease ended" in raw, "the holds table says no lease ended")
        holds = raw.split('<table class="holds">', 1)[1].split("</table>", 1)[0]
        self.assertEqual(holds.count("<tr>") - 1, 10)
        self.assertEqual(holds.count("<td class=\"n\">200ms</td>"), 10, holds[:400])
        jobs = raw.split('<table class="jobs">', 1)[1].split("</table>", 1)[0]
        self.assertIn("<td>--arrivals</td>", jobs)
        self.assertIn(f'<td class="n">{sum(sim["refused"].values())}</td>', jobs)
        self.assertFalse("No request was refused" in raw, "the jobs table says nothing was refused")
        self.assertEqual(figures["granted"], sim["granted"])
        for reason in ("busy", "full", "timeout", "shed"):
            self.assertEqual(figures[reason], sim["refused"][reason], reason)
        self.assertEqual(figures["longest-wait"], sim["longestWaitMs"])
        self.assertEqual(figures["peak-waiting"], max(sim["peakQueueBySecond"]))
        self.assertEqual(figures["peak-in-use"], 6)
        self.assertGreater(page.pools["default"]["charts"]["timeline"]["congested"], 0)
        self.assertEqual(page.fetches, [])

        p = slotctl(*args, "--html", out, "--sweep", "limit=6..7", check=False)
        self.assertEqual(p.returncode, 64)

    def test_report_in_chromium(self):
        if not CHROMIUM:
            self.skipTest("chromium is not installed (Debian's chromium package)")
        _, text = self.report()
        path = os.path.join(self.dir, "test_report_in_chromium.html")
        profile = tempfile.mkdtemp(prefix="chromium-", dir=self.dir)
        common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                  f"--user-data-dir={profile}", "--hide-scrollbars"]
        dom = subprocess.run(common + ["--dump-dom", f"file://{path}"], capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL)
        self.assertEqual(dom.returncode, 0, dom.stderr[-2000:])
        self.check_page(Page(dom.stdout))

        png = os.path.join(self.dir, "report.png")
        shot = subprocess.run(common + [f"--screenshot={png}", "--window-size=1000,1400", f"file://{path}"],
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        self.assertEqual(shot.returncode, 0, shot.stderr[-2000:])
        size, colours = png_size_and_colours(png)
        self.assertEqual(size, (1000, 1400))
        self.assertGreater(colours, 16, "the screenshot is blank")
        if os.environ.get("SLOTBROKER_REPORT_PNG"):
            shutil.copy(png, os.environ["SLOTBROKER_REPORT_PNG"])

    def test_label_sets(self):
        """A labelled workload through brokerd: the report counts its waits and refusals per label set, and
        only for the pool whose requests asked for labels or a member."""
        b = harness.Broker(RIGS_CONFIG, name="report-labels").start()
        # The replay below runs on a millisecond clock: the steps are 20 ms apart (at least), so that its
        # rounding of arrivals and holds to whole milliseconds reorders none of them. A workload's pace,
        # not a synchronisation: every step still waits for its own reply.
        step = lambda: time.sleep(0.02)
        try:
            held_a = b.acquire("ff", member="a")
            held_a.until_granted()
            step()
            held_b = b.acquire("ff", labels=["arm64"])            # b: a is held
            held_b.until_granted()
            for _ in range(2):                                     # a and b held: c is no use
                step()
                busy = b.acquire("ff", labels=["arm64"])
                assert busy.error == "io.slotbroker.Busy", busy.msg
                busy.close()
            step()
            held_c = b.acquire("ff", labels=["usb3", "!arm64"])    # c
            held_c.until_granted()
            step()
            plain = b.acquire("ff")                                # asks nothing: every rig is held
            assert plain.error == "io.slotbroker.Busy", plain.msg
            plain.close()
            step()
            waiter = b.acquire("w", labels=["arm64"])
            assert waiter.queued, waiter.msg
            step()
            held_a.close()                                         # a frees: the waiter gets it
            waiter.until_granted()
            step()
            for x in (waiter, held_b, held_c):
                x.close()
            b.wait_idle()

            def granted():
                p = slotctl("history", "--json", "--socket", b.socket_path, "--decision", "granted")
                return len(json.loads(p.stdout)["events"]) == 4 or None
            wait_for(granted, 10, message="the grants in the history")
        finally:
            status = b.stop()
        self.assertEqual(status, 0, b.log()[-2000:])
        path = os.path.join(self.dir, "labels.db")
        shutil.copy(os.path.join(b.state_dir, "history.db"), path)

        _, text = self.report(history=path)
        self.check_label_sets(Page(text))
        if CHROMIUM:
            out = os.path.join(self.dir, "test_label_sets.html")
            profile = tempfile.mkdtemp(prefix="chromium-", dir=self.dir)
            dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                  "--no-first-run", f"--user-data-dir={profile}", "--dump-dom", f"file://{out}"],
                                 capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
            self.assertEqual(dom.returncode, 0, dom.stderr[-2000:])
            self.check_label_sets(Page(dom.stdout))

        # The same history replayed against the same members and labels (slotctl simulate --replay --config)
        # and drawn: the same requests, grants and refusals per label set as recorded.
        conf = os.path.join(self.dir, "rigs.conf")
        with open(conf, "w") as f:
            f.write(RIGS_CONFIG)
        drawn = os.path.join(self.dir, "replayed.html")
        slotctl("simulate", "--replay", path, "--config", conf, "--html", drawn)
        with open(drawn) as f:
            replayed = Page(f.read()).pools["rigs"]["selectors"]
        recorded = Page(text).pools["rigs"]["selectors"]
        self.assertEqual(replayed.keys(), recorded.keys())
        for k in recorded:
            self.assertEqual({c: n for c, n in replayed[k].items() if c != "longest-ms"},
                             {c: n for c, n in recorded[k].items() if c != "longest-ms"}, k)

        # A capacity curve re-runs the requests without the members and labels they asked for: the page
        # says why there is none rather than draw a wrong one.
        _, swept = self.report("--replay-sweep=limit=2..3", history=path)
        self.assertIn("could not be replayed", swept)
        self.assertIn("asked for labels or a member", swept)

        # The pool of the main history asked nothing of its members: no such table there.
        _, main = self.report()
        self.assertNotIn("class=\"selectors\"", main)

    def check_label_sets(self, page):
        got = page.pools["rigs"]["selectors"]
        zero = {r: 0 for r in REASONS}
        self.assertEqual(got["arm64"], {**zero, "requests": 4, "granted": 2, "waited": 1, "busy": 2,
                                        "longest-ms": got["arm64"]["longest-ms"]})
        self.assertEqual(got["@a"], {**zero, "requests": 1, "granted": 1, "waited": 0, "longest-ms": 0})
        self.assertEqual(got["!arm64 usb3"], {**zero, "requests": 1, "granted": 1, "waited": 0, "longest-ms": 0})
        self.assertEqual(got[""], {**zero, "requests": 1, "granted": 0, "waited": 0, "busy": 1, "longest-ms": 0})
        self.assertEqual(list(got)[0], "arm64")  # the most requests first

    def test_member_usage(self):
        """Usage per member through brokerd (SPEC §3.6): slotctl run's exit status 3 quarantines rig a (a
        failure and a quarantine), b is held twice (exit 0, then exit 1: a failure) and quarantined by a person; the report's table per member
        says so, in chromium too, and its chart has a bar per member."""
        import pwd
        admin = pwd.getpwuid(os.getuid()).pw_name
        b = harness.Broker(LIFE_CONFIG.format(admin=admin), name="report-life").start()
        try:
            def run(member, status):
                p = subprocess.run([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "w", "--member", member,
                                    "--job", f"job-{member}", "--", "sh", "-c", f"sleep 0.05; exit {status}"],
                                   capture_output=True, text=True, timeout=60, env=ENV, stdin=subprocess.DEVNULL)
                self.assertEqual(p.returncode, status, p.stderr)
            run("a", 3)
            run("b", 0)
            run("b", 1)  # a failure, though not a quarantine exit status
            p = subprocess.run([SLOTCTL, "quarantine", "--socket", b.socket_path, "life", "b", "--reason", "flash worn"],
                               capture_output=True, text=True, timeout=60, env=ENV, stdin=subprocess.DEVNULL)
            self.assertEqual(p.returncode, 0, p.stderr)

            def recorded():
                p = slotctl("history", "--json", "--socket", b.socket_path, "--decision", "quarantined")
                q = json.loads(p.stdout)["events"]
                p = slotctl("history", "--json", "--socket", b.socket_path, "--decision", "released")
                r = json.loads(p.stdout)["events"]
                return (q, r) if len(q) == 2 and len(r) == 3 else None
            quarantines, releases = wait_for(recorded, 10, message="the releases and quarantines in the history")
            # History names the members and the exit status that quarantined one (schema 6).
            self.assertEqual([e.get("member") for e in releases], ["a", "b", "b"])
            self.assertEqual([e.get("exitStatus") for e in releases], [3, 0, 1])
            self.assertEqual([(e["member"], e.get("exitStatus"), e.get("job")) for e in quarantines],
                             [("a", 3, "job-a"), ("b", None, f"uid {os.getuid()}")])
            text = slotctl("history", "--socket", b.socket_path).stdout
            self.assertRegex(text, r"quarantined .* job-a\s+@a \(exit 3\)")
            self.assertRegex(text, r"quarantined .* @b \(flash worn\)")
            self.assertRegex(text, r"released .* job-b\s+on b")
        finally:
            status = b.stop()
        self.assertEqual(status, 0, b.log()[-2000:])
        path = os.path.join(self.dir, "life.db")
        shutil.copy(os.path.join(b.state_dir, "history.db"), path)

        _, text = self.report(history=path)
        self.check_members(Page(text))
        if CHROMIUM:
            out = os.path.join(self.dir, "test_member_usage.html")
            profile = tempfile.mkdtemp(prefix="chromium-", dir=self.dir)
            dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                  "--no-first-run", f"--user-data-dir={profile}", "--dump-dom", f"file://{out}"],
                                 capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
            self.assertEqual(dom.returncode, 0, dom.stderr[-2000:])
            self.check_members(Page(dom.stdout))

        # A pool of anonymous slots has no member: no table there.
        _, main = self.report()
        self.assertNotIn("class=\"members\"", main)

    def test_member_of_a_lease_that_ended_while_down(self):
        """A lease whose client died while brokerd was down is released at the restart: that row names its
        member too, so the member's lease is counted (its grant row may have died with brokerd: rows are
        written in batches)."""
        b = harness.Broker("[pool life]\nmembers = a b\n\n[lane w]\npools = life\npolicy = fail-fast\n",
                           name="report-down").start()
        child = harness.Child()
        self.addCleanup(child.kill)
        try:
            a = b.acquire("w", member="b", job="down", pid=child.pid)
            a.until_granted()
            b.crash()
            child.kill()
            b.start()

            def released():
                p = slotctl("history", "--json", "--socket", b.socket_path, "--decision", "released")
                return len(json.loads(p.stdout)["events"]) == 1 or None
            wait_for(released, 10, message="the release at the restart in the history")
        finally:
            status = b.stop()
        self.assertEqual(status, 0, b.log()[-2000:])
        path = os.path.join(self.dir, "down.db")
        shutil.copy(os.path.join(b.state_dir, "history.db"), path)
        _, text = self.report(history=path)
        got = Page(text).pools["life"]["members"]
        self.assertEqual(set(got), {"b"})
        self.assertEqual(got["b"]["holds"], 1)
        self.assertLessEqual(got["b"]["grants"], 1)

    def check_members(self, page):
        pool = page.pools["life"]
        got = pool["members"]
        self.assertEqual(set(got), {"a", "b"})
        self.assertEqual({k: v for k, v in got["a"].items() if k not in ("use", "held-ms")},
                         {"grants": 1, "holds": 1, "failures": 1, "quarantines": 1})
        self.assertEqual({k: v for k, v in got["b"].items() if k not in ("use", "held-ms")},
                         {"grants": 2, "holds": 2, "failures": 1, "quarantines": 1})
        for m in got.values():
            self.assertGreaterEqual(m["held-ms"], 50 * m["holds"])
            self.assertGreater(m["use"], 0)
            self.assertLessEqual(m["use"], 1)
        self.assertEqual(pool["charts"]["members"]["bars"], 2)

    def test_report_of_one_pool_without_events(self):
        _, text = self.report("--pool", "idle")
        page = Page(text)
        self.assertEqual(list(page.pools), ["idle"])
        self.assertEqual(page.pools["idle"]["charts"], {})
        self.assertIn("Nothing was recorded for this pool", text)

    def test_report_of_a_range_without_rows(self):
        _, text = self.report("--since", "@1000000000", "--until", "@1000003600")
        self.assertIn("holds no decision in this range", text)
        self.assertEqual(Page(text).pools, {})

    def test_bad_input(self):
        missing = os.path.join(self.dir, "missing.db")
        p, _ = self.report(history=missing, check=False)
        self.assertEqual(p.returncode, 64, p.stderr)
        self.assertIn("cannot read", p.stderr)
        self.assertFalse(os.path.exists(missing))  # never created

        other = os.path.join(self.dir, "other.db")
        history_schema(other, application_id=1).close()
        p, _ = self.report(history=other, check=False)
        self.assertEqual(p.returncode, 64, p.stderr)
        self.assertIn("not a brokerd history database", p.stderr)

        newer = os.path.join(self.dir, "newer.db")
        history_schema(newer, version=1000).close()
        p, _ = self.report(history=newer, check=False)
        self.assertEqual(p.returncode, 64, p.stderr)
        self.assertIn("newer brokerd (schema version 1000", p.stderr)

        p = slotctl("report", "--history", self.history, check=False)
        self.assertEqual(p.returncode, 64)
        self.assertIn("-o", p.stderr)
        p = slotctl("report", "--history", self.history, "-o", "-", "--since", "@20", "--until", "@10", check=False)
        self.assertEqual(p.returncode, 64)
        # A FIFO (or a directory) is no database: refused at once, not waited on for a writer for ever.
        fifo = os.path.join(self.dir, "history.fifo")
        os.mkfifo(fifo)
        for bad in (fifo, self.dir):
            p = subprocess.run([SLOTCTL, "report", "--history", bad, "-o", "-"], capture_output=True, text=True,
                               timeout=10, env=ENV, stdin=subprocess.DEVNULL)
            self.assertEqual(p.returncode, 64, p.stderr)
            self.assertIn("not a regular file", p.stderr)
        # Nothing is before 1970: a usage error, not "Cannot allocate memory" and exit status 1.
        p = slotctl("report", "--history", self.history, "-o", "-", "--until", "@0", check=False)
        self.assertEqual(p.returncode, 64, p.stderr)
        self.assertIn("--until", p.stderr)

    def test_range_comes_from_the_spans(self):
        """Without --since/--until the range is the history's first and last rows: since schema 10 from event_spans
        (a row a span, not the table), and from the rows when the spans hold a time before 1970 (written by
        hand) or there are none."""
        def copy(name, sql):
            path = os.path.join(self.dir, name)
            shutil.copyfile(self.history, path)
            db = sqlite3.connect(path)
            db.executescript(sql)
            db.commit()
            db.close()
            return path

        def range_of(history):
            _, text = self.report(history=history)
            return re.search(r"From <time>(.*?)</time> to <time>(.*?)</time>", text).groups()

        by_rows = range_of(copy("no-spans.db", "DROP TABLE event_spans"))
        self.assertEqual(range_of(self.history), by_rows)
        self.assertEqual(range_of(copy("before-1970.db", "UPDATE event_spans SET min_time = -5")), by_rows)
        earlier = range_of(copy("earlier.db", "UPDATE event_spans SET min_time = min_time - 86400000000"))
        self.assertNotEqual(earlier[0], by_rows[0])
        self.assertEqual(earlier[1], by_rows[1])

    def test_empty_history(self):
        empty = os.path.join(self.dir, "empty.db")
        history_schema(empty).close()
        _, text = self.report(history=empty)
        self.assertIn("holds no decision in this range", text)

    def test_output_to_stdout_and_no_partial_file(self):
        p = slotctl("report", "--history", self.history, "-o", "-")
        self.assertTrue(p.stdout.startswith("<!DOCTYPE html>"))
        self.assertTrue(p.stdout.rstrip().endswith("</html>"))
        p = slotctl("report", "--history", self.history, "-o", os.path.join(self.dir, "no-such-dir", "r.html"),
                    check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "no-such-dir")))

    def test_output_that_is_not_a_regular_file_is_written_through(self):
        """-o onto a FIFO (as onto /dev/null or /dev/stdout, which a root slotctl replaced by a regular file)
        writes into it; onto a symlink, into the file it names, the link kept."""
        fifo = os.path.join(self.dir, "page.fifo")
        os.mkfifo(fifo)
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader: slotctl's open for writing does not block
        try:
            proc = subprocess.Popen([SLOTCTL, "report", "--history", self.history, "-o", fifo], env=ENV,
                                    stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            data = b""
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    chunk = None
                if chunk:
                    data += chunk
                elif proc.poll() is not None:
                    break
                else:
                    select.select([fd], [], [], 0.05)
            self.assertEqual(proc.wait(), 0, proc.stderr.read())
            proc.stderr.close()
        finally:
            os.close(fd)
        self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced")
        self.assertTrue(data.startswith(b"<!DOCTYPE html>"), data[:100])
        self.assertTrue(data.rstrip().endswith(b"</html>"))
        self.assertEqual([n for n in os.listdir(self.dir) if n.startswith("page.fifo.")], [])

        target = os.path.join(self.dir, "published.html")
        with open(target, "w") as f:
            f.write("old")
        link = os.path.join(self.dir, "link.html")
        os.symlink("published.html", link)
        slotctl("report", "--history", self.history, "-o", link)
        self.assertTrue(os.path.islink(link), "the symlink was replaced")
        with open(target) as f:
            self.assertTrue(f.read().startswith("<!DOCTYPE html>"))

        # -o /dev/stdout onto a file the shell opened to append to (>>): appended, not put in the file's place.
        appended = os.path.join(self.dir, "appended.html")
        with open(appended, "w") as f:
            f.write("HEAD\n")
        with open(appended, "a") as out:
            subprocess.run([SLOTCTL, "report", "--history", self.history, "-o", "/dev/stdout"], env=ENV, check=True,
                           stdin=subprocess.DEVNULL, stdout=out)
        with open(appended) as f:
            text = f.read()
        self.assertTrue(text.startswith("HEAD\n<!DOCTYPE html>"), text[:40])
        self.assertTrue(text.rstrip().endswith("</html>"))

    def test_output_mode_follows_the_umask_or_the_file_it_replaces(self):
        """The page has other users' job labels: a new one is created as the umask says (it was 0644 whatever
        the umask), and one written over keeps the mode it had."""
        new = os.path.join(self.dir, "private.html")
        subprocess.run([SLOTCTL, "report", "--history", self.history, "-o", new], env=ENV, check=True,
                       stdin=subprocess.DEVNULL, capture_output=True, preexec_fn=lambda: os.umask(0o077))
        self.assertEqual(stat.S_IMODE(os.stat(new).st_mode), 0o600)
        os.chmod(new, 0o640)
        slotctl("report", "--history", self.history, "-o", new)
        self.assertEqual(stat.S_IMODE(os.stat(new).st_mode), 0o640)


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
