#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""brokerd's metrics (SPEC §7): Prometheus text that a strict parser accepts, with the values of what
happened.

- A strict parser of the text exposition format 0.0.4, written here: HELP and TYPE before the samples,
  one of each per family, the families' lines together; metric and label name grammar, label value and
  HELP escaping, numbers as Go's ParseFloat reads them; no duplicate series; counters end in _total and
  never go below 0; histograms with _bucket series whose le ascend and end at +Inf, cumulative counts
  that never decrease, _count equal to the +Inf bucket, and _sum. `promtool check metrics` too, when
  Debian's prometheus package is installed (it is optional: its absence is said, not hidden).
- After a known sequence of grants and refusals the counters, gauges and histograms say what happened;
  `slotctl metrics` prints the same as the Metrics method.
- metrics-textfile= is there within 15 s of the start and is replaced atomically: read in a loop across a
  rewrite, every read is a whole, valid file; no temporary file is left behind.

Usage: test-metrics.py BROKERD SLOTCTL [unittest arguments]
"""
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.dont_write_bytecode = True
import harness  # noqa: E402
from harness import VarlinkError, wait_for  # noqa: E402

SLOTCTL = None
PROMTOOL = shutil.which("promtool")

# ---- a strict parser of the text format 0.0.4 ----

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Go's strconv.ParseFloat, as Prometheus reads sample values: decimal or hex floats, Inf, NaN.
FLOAT = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|0[xX][0-9a-fA-F.]+[pP][+-]?\d+|[Ii]nf(?:inity)?|NaN)")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


class ExpositionError(AssertionError):
    pass


def parse_float(text, where):
    if not FLOAT.fullmatch(text):
        raise ExpositionError(f"{where}: {text!r} is not a number")
    return float(text.replace("infinity", "inf").replace("Infinity", "inf"))


def parse_labels(text, pos, where):
    """Parses {name="value",…} from text[pos] == "{"; returns (labels as a list of pairs, the position after
    the closing brace)."""
    assert text[pos] == "{"
    pos += 1
    labels = []
    while True:
        if text[pos:pos + 1] == "}":
            return labels, pos + 1
        m = LABEL_NAME.match(text, pos)
        if not m:
            raise ExpositionError(f"{where}: bad label name at {text[pos:pos + 20]!r}")
        name = m.group(0)
        if name.startswith("__"):
            raise ExpositionError(f"{where}: label name {name} is reserved")
        pos = m.end()
        if text[pos:pos + 2] != '="':
            raise ExpositionError(f"{where}: expected =\" after label {name}")
        pos += 2
        value = []
        while True:
            if pos >= len(text):
                raise ExpositionError(f"{where}: unterminated label value")
            c = text[pos]
            if c == "\\":
                e = text[pos + 1:pos + 2]
                if e not in ("\\", '"', "n"):
                    raise ExpositionError(f"{where}: bad escape \\{e} in a label value")
                value.append("\n" if e == "n" else e)
                pos += 2
            elif c == '"':
                pos += 1
                break
            elif c == "\n":
                raise ExpositionError(f"{where}: newline in a label value")
            else:
                value.append(c)
                pos += 1
        labels.append((name, "".join(value)))
        if text[pos:pos + 1] == ",":
            pos += 1  # a trailing comma before } is allowed by the format
        elif text[pos:pos + 1] != "}":
            raise ExpositionError(f"{where}: expected , or }} after label {name}")


def family_of(name, types):
    """The family a sample belongs to: histograms own NAME_bucket, _sum and _count; summaries _sum, _count."""
    for suffix, kinds in (("_bucket", ("histogram",)), ("_sum", ("histogram", "summary")),
                          ("_count", ("histogram", "summary"))):
        if name.endswith(suffix) and types.get(name[:-len(suffix)]) in kinds:
            return name[:-len(suffix)]
    return name


def parse_exposition(text):
    """Parses the text strictly. Returns {family: {"type", "help", "samples": [(name, labels dict, value)]}};
    raises ExpositionError naming the first problem."""
    if not text.endswith("\n"):
        raise ExpositionError("the text does not end with a newline")
    families, types, order = {}, {}, []
    series = set()
    current = None
    for n, line in enumerate(text.split("\n")[:-1], 1):
        where = f"line {n} ({line[:80]!r})"
        if line.strip() == "":
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                kind, name = parts[1], parts[2]
                if not METRIC_NAME.fullmatch(name):
                    raise ExpositionError(f"{where}: bad metric name {name!r}")
                f = families.setdefault(name, {"type": None, "help": None, "samples": []})
                if name not in order:
                    order.append(name)
                elif current != name:
                    raise ExpositionError(f"{where}: {name}'s lines are not together")
                if f["samples"]:
                    raise ExpositionError(f"{where}: {kind} of {name} after its samples")
                current = name
                if kind == "HELP":
                    if f["help"] is not None:
                        raise ExpositionError(f"{where}: second HELP for {name}")
                    doc = parts[3] if len(parts) > 3 else ""
                    if re.search(r"\\[^\\n]|\\$", doc):
                        raise ExpositionError(f"{where}: bad escape in HELP")
                    f["help"] = doc
                else:
                    if f["type"] is not None:
                        raise ExpositionError(f"{where}: second TYPE for {name}")
                    if len(parts) != 4 or parts[3] not in TYPES:
                        raise ExpositionError(f"{where}: bad TYPE line")
                    f["type"] = types[name] = parts[3]
            continue  # other comments are allowed
        m = METRIC_NAME.match(line)
        if not m:
            raise ExpositionError(f"{where}: bad metric name")
        name, pos = m.group(0), m.end()
        labels = []
        if line[pos:pos + 1] == "{":
            labels, pos = parse_labels(line, pos, where)
        rest = line[pos:]
        if not rest.startswith(" ") or rest.strip() == "":
            raise ExpositionError(f"{where}: expected a space and a value")
        fields = rest.split()
        if len(fields) not in (1, 2) or rest != " " + " ".join(fields):
            raise ExpositionError(f"{where}: expected VALUE [TIMESTAMP] separated by single spaces")
        value = parse_float(fields[0], where)
        if len(fields) == 2 and not re.fullmatch(r"-?\d+", fields[1]):
            raise ExpositionError(f"{where}: bad timestamp")
        names = [k for k, _ in labels]
        if len(names) != len(set(names)):
            raise ExpositionError(f"{where}: a label given twice")
        fam = family_of(name, types)
        f = families.setdefault(fam, {"type": None, "help": None, "samples": []})
        if fam not in order:
            order.append(fam)
        elif current != fam:
            raise ExpositionError(f"{where}: the samples of {fam} are not together")
        current = fam
        key = (name, frozenset(labels))
        if key in series:
            raise ExpositionError(f"{where}: duplicate series")
        series.add(key)
        f["samples"].append((name, dict(labels), value))
    for name, f in families.items():
        check_family(name, f)
    return families


def check_family(name, f):
    kind = f["type"]
    if kind is None or f["help"] is None:
        raise ExpositionError(f"{name}: no TYPE or no HELP line")
    if not f["samples"]:
        return
    if kind == "counter":
        if not name.endswith("_total"):
            raise ExpositionError(f"counter {name} does not end in _total")
        for s, _, v in f["samples"]:
            if s != name or not v >= 0 or math.isinf(v):
                raise ExpositionError(f"counter {name}: sample {s} = {v}")
    elif kind == "gauge":
        if any(s != name for s, _, _ in f["samples"]):
            raise ExpositionError(f"gauge {name} has samples of other names")
    elif kind == "histogram":
        check_histogram(name, f["samples"])


def check_histogram(name, samples):
    groups = {}
    for s, labels, v in samples:
        base = frozenset((k, x) for k, x in labels.items() if k != "le")
        g = groups.setdefault(base, {"buckets": [], "sum": None, "count": None})
        if s == name + "_bucket":
            if "le" not in labels:
                raise ExpositionError(f"{name}_bucket without le")
            g["buckets"].append((parse_float(labels["le"], f"{name} le"), labels["le"], v))
        elif s == name + "_sum":
            g["sum"] = v
        elif s == name + "_count":
            g["count"] = v
        else:
            raise ExpositionError(f"histogram {name} has a sample {s}")
        if s != name + "_bucket" and "le" in labels:
            raise ExpositionError(f"{s} has an le label")
    for base, g in groups.items():
        where = f"histogram {name}{dict(base)}"
        bounds = [b for b, _, _ in g["buckets"]]
        if not bounds or bounds[-1] != math.inf or g["buckets"][-1][1] != "+Inf":
            raise ExpositionError(f"{where}: the last bucket is not le=\"+Inf\"")
        if any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise ExpositionError(f"{where}: le not ascending: {bounds}")
        counts = [v for _, _, v in g["buckets"]]
        if any(a > b for a, b in zip(counts, counts[1:])) or any(v < 0 or v != int(v) for v in counts):
            raise ExpositionError(f"{where}: bucket counts not cumulative: {counts}")
        if g["count"] is None or g["sum"] is None:
            raise ExpositionError(f"{where}: no _count or no _sum")
        if g["count"] != counts[-1]:
            raise ExpositionError(f"{where}: _count {g['count']} ≠ the +Inf bucket {counts[-1]}")


def value(families, name, **labels):
    """The value of one series; 0 when the series is absent (a counter nobody incremented yet)."""
    fam = families.get(family_of(name, {k: f["type"] for k, f in families.items()}))
    for s, ls, v in (fam or {}).get("samples", []):
        if s == name and ls == {k: str(x) for k, x in labels.items()}:
            return v
    return 0


def buckets(families, name, **labels):
    """{le bound: cumulative count} of one histogram series."""
    out = {}
    for s, ls, v in families[name]["samples"]:
        if s == name + "_bucket" and {k: x for k, x in ls.items() if k != "le"} == labels:
            out[float(ls["le"])] = v
    return out


# ---- the tests ----

CONFIG = """\
[pool p]
limit = 2
queue-timeout = 1s
max-queue = 1

[pool q]
limit = 1

[lane ff]
pools = p
policy = fail-fast

[lane w]
pools = p
policy = wait

[lane qw]
pools = q
policy = wait

[lane locked]
pools = q
allow-users = root
"""


class Parser(unittest.TestCase):
    """The parser itself: it must refuse what Prometheus refuses, or it proves nothing."""

    GOOD = ('# HELP a_total A.\n# TYPE a_total counter\na_total{x="1",y="a\\"b\\\\c\\n"} 3\n'
            '# HELP h H.\n# TYPE h histogram\nh_bucket{le="0.5"} 1\nh_bucket{le="+Inf"} 2\nh_sum 0.7\nh_count 2\n')

    def test_accepts_good_text(self):
        f = parse_exposition(self.GOOD)
        self.assertEqual(value(f, "a_total", x=1, y='a"b\\c\n'), 3)
        self.assertEqual(buckets(f, "h"), {0.5: 1, math.inf: 2})

    def test_refuses_bad_text(self):
        bad = {
            "no newline at the end": self.GOOD[:-1],
            "sample before TYPE": "a_total 1\n# HELP a_total A.\n# TYPE a_total counter\n",
            "no HELP": "# TYPE g gauge\ng 1\n",
            "two TYPEs": "# HELP g G.\n# TYPE g gauge\n# TYPE g gauge\ng 1\n",
            "counter without _total": "# HELP c C.\n# TYPE c counter\nc 1\n",
            "bad metric name": "# HELP 1g G.\n# TYPE 1g gauge\n1g 1\n",
            "bad label name": '# HELP g G.\n# TYPE g gauge\ng{1x="a"} 1\n',
            "bad escape": '# HELP g G.\n# TYPE g gauge\ng{x="\\t"} 1\n',
            "duplicate series": '# HELP g G.\n# TYPE g gauge\ng{x="a"} 1\ng{x="a"} 2\n',
            "bad value": "# HELP g G.\n# TYPE g gauge\ng one\n",
            "no +Inf bucket": '# HELP h H.\n# TYPE h histogram\nh_bucket{le="1"} 1\nh_sum 1\nh_count 1\n',
            "le descending": ('# HELP h H.\n# TYPE h histogram\nh_bucket{le="2"} 1\nh_bucket{le="1"} 1\n'
                              'h_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n'),
            "not cumulative": ('# HELP h H.\n# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\n'
                               'h_sum 1\nh_count 1\n'),
            "count ≠ +Inf": '# HELP h H.\n# TYPE h histogram\nh_bucket{le="+Inf"} 2\nh_sum 1\nh_count 1\n',
            "no _sum": '# HELP h H.\n# TYPE h histogram\nh_bucket{le="+Inf"} 1\nh_count 1\n',
            "split family": ('# HELP g G.\n# TYPE g gauge\ng{a="1"} 1\n'
                             '# HELP k K.\n# TYPE k gauge\nk 1\ng{a="2"} 1\n'),
        }
        for what, text in bad.items():
            with self.subTest(what), self.assertRaises(ExpositionError):
                parse_exposition(text)


class Metrics(harness.BrokerTestCase):

    def metrics(self, b, promtool=True):
        text = b.call("io.slotbroker.Metrics")["text"]
        fams = parse_exposition(text)
        if promtool:
            self.promtool(text)  # a process start: not where a test times a wait
        return text, fams

    def promtool(self, text):
        if not PROMTOOL:
            return
        p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
        self.assertEqual((p.returncode, p.stdout.strip(), p.stderr.strip()), (0, "", ""),
                         "promtool check metrics refuses the text")

    def test_promtool_is_used_when_installed(self):
        if not PROMTOOL:
            self.skipTest("promtool not installed (Debian 12: apt install prometheus): the strict parser alone checks")
        with self.assertRaises(AssertionError):  # it does refuse what is wrong
            self.promtool("# HELP c C.\n# TYPE c counter\nc 1\n")

    def test_values_after_a_known_sequence(self):
        b = self.broker(CONFIG, "metrics")
        # Two immediate grants fill p; a fail-fast request is busy; one waits, the next finds the queue full.
        a1 = self.acquire(b, "w", job="a1")
        a1.until_granted()
        a2 = self.acquire(b, "w", job="a2")
        a2.until_granted()
        with self.assertRaises(VarlinkError) as e:
            b.call("io.slotbroker.Acquire", {"lane": "ff"})
        self.assertEqual(e.exception.error, "io.slotbroker.Busy")
        d = self.acquire(b, "w", job="d")
        self.assertTrue(d.queued)
        d_queued = time.monotonic()
        with self.assertRaises(VarlinkError) as e:
            b.call("io.slotbroker.Acquire", {"lane": "w"})
        self.assertEqual(e.exception.error, "io.slotbroker.QueueFull")
        # Gauges while p is full with one waiter.
        _, f = self.metrics(b, promtool=False)
        self.assertEqual((value(f, "slotbroker_slots", pool="p"), value(f, "slotbroker_slots", pool="q")), (2, 1))
        self.assertEqual(value(f, "slotbroker_slots_in_use", pool="p"), 2)
        self.assertEqual(value(f, "slotbroker_queue_length", pool="p"), 1)
        self.assertEqual(value(f, "slotbroker_queue_length", pool="q"), 0)
        # d waits 0.25 s, then a1 ends: d is granted (a wait between 0.1 s and 0.5 s).
        time.sleep(max(0.0, d_queued + 0.25 - time.monotonic()))
        a1.close()
        d.until_granted()
        # A waiter times out (budget 1 s, Q while keeping up); then p is congested: no room and no fast
        # admission for longer than Q; the next waiter gets the saturated budget and is shed.
        t = self.acquire(b, "w", job="t")
        self.assertTrue(t.queued)
        t.until(lambda a: a.error, timeout=5, what="the timeout")
        self.assertEqual(t.error, "io.slotbroker.QueueTimeout")
        wait_for(lambda: b.pool("p")["congested"], 5, message="pool p congested")
        _, f = self.metrics(b)
        self.assertEqual(value(f, "slotbroker_queue_congested", pool="p"), 1)
        self.assertEqual(value(f, "slotbroker_queue_congested", pool="q"), 0)
        s = self.acquire(b, "w", job="s")
        s.until(lambda a: a.error, timeout=5, what="the shed")
        self.assertEqual(s.error, "io.slotbroker.QueueShed")
        # On q: a grant, a waiter refused when q is drained, a request the lane's ACL denies.
        q1 = self.acquire(b, "qw", job="q1")
        q1.until_granted()
        qw = self.acquire(b, "qw", job="q2")
        self.assertTrue(qw.queued)
        b.call("io.slotbroker.Drain", {"pool": "q", "on": True})
        qw.until(lambda a: a.error, what="the refusal")
        self.assertEqual(qw.error, "io.slotbroker.Unavailable")
        b.call("io.slotbroker.Drain", {"pool": "q", "on": False})
        denied = harness.run_client_as(b.socket_path, "io.slotbroker.Acquire", {"lane": "locked"})
        self.assertEqual(denied[0].get("error"), "io.slotbroker.PermissionDenied", denied)
        q1.close()
        a2.close()
        d.close()
        b.wait_idle()
        # Every decision's history row is written within the writer's flush delay: nothing stays pending.
        wait_for(lambda: value(self.metrics(b, promtool=False)[1], "slotbroker_history_rows_pending") == 0, 5,
                 message="history rows written")
        events = b.call("io.slotbroker.History", {"limit": 100})["events"]
        self.assertEqual(sum(e["decision"] == "granted" for e in events), 4, events)

        text, f = self.metrics(b)
        self.assertEqual(value(f, "slotbroker_history_rows_pending"), 0)
        self.assertEqual(value(f, "slotbroker_history_rows_dropped_total"), 0)
        expect = {
            ("slotbroker_granted_total", ("p", "w")): 3,
            ("slotbroker_granted_total", ("q", "qw")): 1,
            ("slotbroker_rejected_total", ("p", "ff", "busy")): 1,
            ("slotbroker_rejected_total", ("p", "w", "full")): 1,
            ("slotbroker_rejected_total", ("p", "w", "timeout")): 1,
            ("slotbroker_rejected_total", ("p", "w", "shed")): 1,
            ("slotbroker_rejected_total", ("q", "qw", "unavailable")): 1,
        }
        seen = {}
        for name in ("slotbroker_granted_total", "slotbroker_rejected_total"):
            for _, ls, v in f[name]["samples"]:
                seen[(name, tuple(ls[k] for k in ("pool", "lane", "reason") if k in ls))] = v
        self.assertEqual(seen, expect, text)
        self.assertEqual(value(f, "slotbroker_denied_total"), 1)
        for pool in ("p", "q"):
            self.assertEqual(value(f, "slotbroker_slots_in_use", pool=pool), 0)
            self.assertEqual(value(f, "slotbroker_queue_length", pool=pool), 0)
        self.assertEqual(value(f, "slotbroker_leases"), 0)
        # Waits: a1 and a2 at once, d about 0.25 s; q1 at once.
        w = buckets(f, "slotbroker_wait_seconds", pool="p")
        self.assertEqual((w[0.001], w[0.1], w[0.5], w[math.inf]), (2, 2, 3, 3), w)
        self.assertEqual(value(f, "slotbroker_wait_seconds_count", pool="q"), 1)
        self.assertAlmostEqual(value(f, "slotbroker_wait_seconds_sum", pool="p"), 0.25, delta=0.2)
        # Holds: a1 less than 1 s, a2 and d longer (the timeout and the shed took 2 s), q1 short.
        h = buckets(f, "slotbroker_hold_seconds", pool="p")
        self.assertEqual((h[1], h[10], h[math.inf]), (1, 3, 3), h)
        self.assertEqual(value(f, "slotbroker_hold_seconds_count", pool="q"), 1)
        held = value(f, "slotbroker_hold_seconds_sum", pool="p")
        self.assertGreater(held, 0.25 + 2 * 1.5)

        # slotctl metrics prints the same text (but for its own connection in slotbroker_connections).
        p = subprocess.run([SLOTCTL, "metrics", "--socket", b.socket_path], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        g = parse_exposition(p.stdout)
        self.promtool(p.stdout)
        strip = re.compile(r"^slotbroker_connections .*$", re.M)
        self.assertEqual(strip.sub("", p.stdout), strip.sub("", text))
        self.assertEqual(set(g), set(f))

    def test_a_revoked_lease_is_one_hold(self):
        """A lease revoked by max-hold is recorded "revoked" when it is revoked and "released" when its slots
        free: one hold in slotbroker_hold_seconds, with the whole hold."""
        b = self.broker("[pool q]\nlimit = 1\n\n[lane mh]\npools = q\nmax-hold = 300ms\n", "metrics")
        a = self.acquire(b, "mh")
        a.until_granted()
        a.until(lambda x: x.state == "revoked", timeout=5, what="the revocation")
        a.close()
        b.wait_idle()
        _, f = self.metrics(b)
        self.assertEqual(value(f, "slotbroker_hold_seconds_count", pool="q"), 1)

    def test_a_text_longer_than_the_output_cap_is_sent_whole(self):
        """A member pool's families grow with its members: with 1500 members the text is some 400 KiB, far
        past max-output-per-connection=4K (the smallest allowed). A client that reads gets it whole, and the
        call pipelined behind it its own answer after it; brokerd does not take it for a client that does
        not read its replies and cut it off."""
        members = " ".join(f"rig-{i:04d}" for i in range(1500))
        b = self.broker("[broker]\nmax-output-per-connection = 4K\n\n"
                        f"[pool rigs]\nmembers = {members}\n\n[lane l]\npools = rigs\n", "metrics")
        with b.connect() as c:
            c.send("io.slotbroker.Metrics")
            c.send("org.varlink.service.GetInfo")
            text = c.reply(timeout=20)[0]["text"]
            self.assertIn("io.slotbroker", c.reply()[0]["interfaces"])
        self.assertGreater(len(text), 64 * 4096)
        f = parse_exposition(text)
        for family in ("slotbroker_member_quarantined", "slotbroker_member_quarantines_total",
                       "slotbroker_member_grants_total", "slotbroker_member_held_seconds_total"):
            self.assertEqual(len(f[family]["samples"]), 1500, family)
        self.assertIn("slotbroker_history_healthy", f, "the text ends early")
        p = subprocess.run([SLOTCTL, "metrics", "--socket", b.socket_path], capture_output=True, text=True, timeout=30)
        self.assertEqual((p.returncode, p.stderr), (0, ""))
        self.assertEqual(len(parse_exposition(p.stdout)["slotbroker_member_grants_total"]["samples"]), 1500)
        self.assertNotIn("does not read its replies", b.log())
        # One that does not read holds its reply, and stalls nobody else.
        with b.connect() as stuck:
            stuck.send("io.slotbroker.Metrics")
            self.assertTrue(b.responsive())
            self.assertEqual(len(parse_exposition(b.call("io.slotbroker.Metrics", timeout=20)["text"])
                                 ["slotbroker_member_quarantined"]["samples"]), 1500)

    def test_a_status_longer_than_the_output_cap_is_sent_whole(self):
        """Status lists a member pool's members: with 1500 of them its reply is past max-output-per-connection=4K
        too, and goes out as the client reads it, as Metrics does: whole, the call pipelined behind it answered
        after it, and no client cut off for not reading."""
        members = [f"rig-{i:04d}" for i in range(1500)]
        b = self.broker("[broker]\nmax-output-per-connection = 4K\n\n"
                        f"[pool rigs]\nmembers = {' '.join(members)}\n\n[lane l]\npools = rigs\n", "status")
        a = self.acquire(b, "l")
        lease = a.until_granted()
        with b.connect() as c:
            c.send("io.slotbroker.Status")
            c.send("org.varlink.service.GetInfo")
            status = c.reply(timeout=20)[0]
            self.assertIn("io.slotbroker", c.reply()[0]["interfaces"])
        pool = next(p for p in status["pools"] if p["name"] == "rigs")
        self.assertEqual(pool["members"], members)
        self.assertEqual(pool["inUse"], 1)
        self.assertEqual([h["lease"]["id"] for h in status["holders"]], [lease["id"]])
        # slotctl status reads it whole too.
        p = subprocess.run([SLOTCTL, "status", "--json", "--socket", b.socket_path], capture_output=True, text=True,
                           timeout=30)
        self.assertEqual((p.returncode, p.stderr), (0, ""))
        self.assertIn("rig-1499", p.stdout)
        self.assertNotIn("does not read its replies", b.log())
        # One that does not read holds its reply, and stalls nobody else.
        with b.connect() as stuck:
            stuck.send("io.slotbroker.Status")
            self.assertTrue(b.responsive())
            self.assertEqual(len(b.call("io.slotbroker.Status", timeout=20)["pools"][0]["members"]), 1500)
        a.close()

    def test_textfile_is_written_atomically(self):
        d = tempfile.mkdtemp(prefix="metrics-textfile-")
        self.addCleanup(shutil.rmtree, d, True)
        path = os.path.join(d, "slotbroker.prom")
        start = time.monotonic()
        b = self.broker(CONFIG.replace("[pool p]", f"[broker]\nmetrics-textfile = {path}\n\n[pool p]", 1), "metrics")
        wait_for(lambda: os.path.exists(path), 20, interval=0.01, message="the metrics textfile")
        first = time.monotonic() - start
        self.assertLess(first, 15.0 + 2.0, "the textfile came later than 15 s after the start")

        # Read it in a loop across a rewrite (every 15 s), with grants going on: every read is a whole file.
        reads, inodes, tmp_seen, grants = 0, set(), set(), 0
        last_grant = 0.0
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            with open(path) as fh:
                text = fh.read()
                inode = os.fstat(fh.fileno()).st_ino
            try:
                f = parse_exposition(text)
            except ExpositionError as e:
                self.fail(f"read {reads}: not a whole, valid file ({e}):\n{text}")
            self.assertIn("slotbroker_wait_seconds", f)
            self.assertIn("slotbroker_history_healthy", f, "the file ends early")
            reads += 1
            inodes.add(inode)
            tmp_seen |= {x for x in os.listdir(d) if x != "slotbroker.prom"}
            if len(inodes) >= 2 and value(f, "slotbroker_granted_total", pool="p", lane="w") >= 1:
                break  # replaced at least once, and the new file says what happened since
            if time.monotonic() - last_grant > 1:
                a = b.acquire("w")
                a.until_granted()
                a.close()
                grants += 1
                last_grant = time.monotonic()
            time.sleep(0.002)
        else:
            self.fail(f"the textfile was not rewritten within 40 s ({reads} reads, {inodes})")
        self.promtool(text)
        print(f"\ntextfile: first after {first:.1f} s, {reads} reads across {len(inodes)} versions, "
              f"temporary names seen: {sorted(tmp_seen) or 'none'}", file=sys.stderr)
        self.assertTrue(all(re.fullmatch(r"slotbroker\.prom\.tmp\.[0-9a-f]{16}", x) for x in tmp_seen), tmp_seen)
        # Nothing is left behind once a write is over.
        wait_for(lambda: os.listdir(d) == ["slotbroker.prom"], 5, message=f"only the textfile in {d}")
        self.assertTrue(b.alive())

    def test_textfile_does_not_follow_a_planted_symlink(self):
        """A user who can write to the textfile's directory plants a symlink where brokerd once put its
        temporary file (PATH.tmp.<pid>), pointing to a file of root's: brokerd must write neither through
        it nor anywhere but its own new file."""
        d = tempfile.mkdtemp(prefix="metrics-textfile-")
        self.addCleanup(shutil.rmtree, d, True)
        os.chmod(d, 0o1777)  # as a shared textfile directory may be
        path = os.path.join(d, "slotbroker.prom")
        victim = os.path.join(d, "victim")
        with open(victim, "w") as f:
            f.write("root's own\n")
        os.chmod(victim, 0o600)
        b = harness.Broker(CONFIG.replace("[pool p]", f"[broker]\nmetrics-textfile = {path}\n\n[pool p]", 1),
                           name="metrics")
        b.start(wait=False)
        self.addCleanup(self.stop_broker, b)
        os.symlink(victim, f"{path}.tmp.{b.pid}")
        # What is at path now; a write after the symlink was planted replaces it (the first write comes
        # within a second or so of the start, the next 15 s later).
        try:
            before = os.lstat(path).st_ino
        except FileNotFoundError:
            before = None

        def written():
            try:
                return os.lstat(path).st_ino != before
            except FileNotFoundError:
                return False

        wait_for(written, 40, interval=0.01, message="a textfile written after the symlink was planted")
        with open(victim) as f:
            self.assertEqual(f.read(), "root's own\n", "brokerd wrote through the planted symlink")
        self.assertFalse(os.path.islink(path), "the textfile is a symlink (the planted one, renamed)")
        with open(path) as f:
            parse_exposition(f.read())
        self.assertTrue(os.path.islink(f"{path}.tmp.{b.pid}"), "the planted symlink was moved away")
        b.wait_ready()
        self.assertTrue(b.alive())


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
