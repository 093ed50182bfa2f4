#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""contrib/grafana/slotbroker-dashboard.json against what brokerd exports: every metric its queries name is a
series brokerd's Metrics method gives, and every label they select, group or read is a label of those
series (le of a histogram's _bucket too). brokerd runs with a local pool and, when redis-server is there and
brokerd has shared pools, a shared one, after a grant and a refusal on each, so that every family has
series; without Redis the backend panels are skipped, not passed.

Usage: test-grafana.py BROKERD DASHBOARD [unittest arguments]
"""
import json
import os
import re
import shutil
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
from harness import wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402

DASHBOARD = None
BACKEND_METRICS = ("slotbroker_backend_up", "slotbroker_backend_rtt_seconds")

METRIC = re.compile(r"\bslotbroker_[a-z0-9_]+\b")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")
SELECTOR = re.compile(r"\{([^}]*)\}")
LABEL_VALUES = re.compile(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s")
LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)=\"(?:[^\"\\]|\\.)*\"")


def queries(dashboard):
    """Every PromQL expression of the dashboard: its panels' targets and its variables' queries."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for var in dashboard.get("templating", {}).get("list", []):
        q = var.get("query")
        if isinstance(q, dict):
            q = q.get("query")
        if var.get("type") == "query":
            yield f"variable {var['name']}", q


def exported(text):
    """{sample name: set of label names} of a Prometheus text exposition."""
    series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        series.setdefault(m.group(1), set()).update(LABEL.findall(m.group(2) or ""))
    return series


def used(expr):
    """(metric names, label names) an expression reads."""
    labels = set()
    for group in GROUPING.findall(expr):
        labels.update(x.strip() for x in group.split(",") if x.strip())
    for selector in SELECTOR.findall(expr):
        labels.update(MATCHER.findall(selector))
    for _, label in LABEL_VALUES.findall(expr):
        labels.add(label)
    return set(METRIC.findall(expr)), labels


class Dashboard(harness.BrokerTestCase):
    def setUp(self):
        with open(DASHBOARD) as f:
            self.dashboard = json.load(f)

    def check(self, series, only=None):
        """Every query (of the metrics in `only`, or all but the backend's) against the exported series."""
        checked = 0
        for where, expr in queries(self.dashboard):
            metrics, labels = used(expr)
            self.assertTrue(metrics, f"{where}: {expr!r} reads no slotbroker_ metric")
            backend = any(m.startswith(BACKEND_METRICS) for m in metrics)
            if (only is None and backend) or (only is not None and not backend):
                continue
            have = set()
            for m in metrics:
                self.assertIn(m, series, f"{where}: {m} is not a series brokerd exports")
                have |= series[m]
            self.assertLessEqual(labels - {"le"} if any(m.endswith("_bucket") for m in metrics) else labels, have,
                                 f"{where}: {expr!r} uses labels that {sorted(metrics)} do not have")
            checked += 1
        return checked

    def test_structure(self):
        d = self.dashboard
        self.assertEqual(d["uid"], "slotbroker")
        ids = [p["id"] for p in d["panels"]]
        self.assertEqual(len(ids), len(set(ids)), "panel ids are unique")
        for p in d["panels"]:
            self.assertTrue(p.get("targets"), f"panel {p['title']} has no query")
            self.assertTrue(p.get("description"), f"panel {p['title']} says what it shows")
            self.assertEqual(p["datasource"]["uid"], "${datasource}", "panels use the chosen data source")
        # What issue 13 asks the dashboard to show.
        names = set()
        for _, expr in queries(d):
            names |= used(expr)[0]
        for m in ("slotbroker_slots", "slotbroker_slots_in_use", "slotbroker_queue_length", "slotbroker_queue_congested",
                  "slotbroker_rejected_total", "slotbroker_wait_seconds_bucket", "slotbroker_hold_seconds_bucket",
                  "slotbroker_backend_up"):
            self.assertIn(m, names)

    def test_local_metrics_and_labels_are_exported(self):
        b = self.broker("""\
[pool grid]
limit = 1
queue-timeout = 5m

[lane merge]
pools = grid
policy = fail-fast
""", "grafana")
        a = b.acquire("merge")
        self.addCleanup(a.close)
        a.until_granted()
        busy = b.acquire("merge")
        self.assertEqual(busy.error, "io.slotbroker.Busy")
        busy.close()
        a.close()
        b.wait_idle()
        series = exported(b.call("io.slotbroker.Metrics")["text"])
        self.assertGreaterEqual(self.check(series), 10)

    def test_backend_metrics_and_labels_are_exported(self):
        faults.skip_unless_shared_pools(self)
        tmp = tempfile.mkdtemp(prefix="test-grafana-")
        self.addCleanup(shutil.rmtree, tmp, True)
        redis = RedisServer(tmp).start()
        self.addCleanup(redis.close)
        b = self.broker(f"""\
[broker]
node-name = grafana
revoke-grace = 1s

[pool shared]
limit = 1
backend = {redis.url()}
backend-node-ttl = 6s

[lane ci]
pools = shared
policy = wait
""", "grafana-shared")
        wait_for(lambda: b.pool("shared")["backend"]["up"], timeout=30, message="the backend up")
        a = b.acquire("ci")
        self.addCleanup(a.close)
        a.until_granted(timeout=30)  # a fresh Redis: the first use waits out one node TTL (recovery)
        a.close()
        b.wait_idle()
        series = exported(b.call("io.slotbroker.Metrics")["text"])
        self.assertEqual(self.check(series, only=BACKEND_METRICS), 2)


if __name__ == "__main__":
    (_, DASHBOARD), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
