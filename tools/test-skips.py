#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""What the last `meson test` run in BUILD_DIR (or the one that wrote LOG.json) skipped, and why, one line
each:

    SKIP  suite / test: reason            a whole test meson reports SKIP (exit 77, a TAP "1..0 # SKIP")
    skip  suite / test: case: reason      a case skipped inside a test meson reports OK (unittest's
                                          skipTest, a TAP "ok N # SKIP")

Used by tools/test.sh, so that the summary of a run shows what could not run where it ran (no root,
no namespaces, no CAP_SYS_ADMIN, a tool missing) instead of hiding it behind "OK".

    test-skips.py BUILD_DIR | BUILD_DIR/meson-logs/LOG.json

Exits 77 when the run skipped every test.
"""
import glob
import json
import os
import re
import sys

TAP_PLAN_SKIP = re.compile(r"^1\.\.0\s*#\s*skip\S*\s*(.*)$", re.I | re.M)
TAP_CASE_SKIP = re.compile(r"^ok\s+\d+\s*-?\s*(.*?)\s*#\s*skip\S*\s*(.*)$", re.I | re.M)
# unittest at verbosity 2: "test_x (module.Class.test_x)", a docstring's first line maybe, then
# "... skipped 'reason'".
UNITTEST_SKIP = re.compile(r"^(test\w*) \([^)\n]*\)(?:\n[^\n]*?)? \.\.\. skipped ['\"](.*)['\"]$", re.M)
SAYS_SKIP = re.compile(r"skip", re.I)


def why_skipped(output):
    """The reason a whole test gave: its TAP plan's, else its unittest cases' (harness.main() exits 77 when
    every case skipped), else its last line that says skip, else its last line."""
    m = TAP_PLAN_SKIP.search(output)
    if m:
        return m.group(1).strip() or "(no reason given)"
    reasons = sorted({reason for _, reason in UNITTEST_SKIP.findall(output)})
    if reasons:
        return "; ".join(reasons)
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    said = [line for line in lines if SAYS_SKIP.search(line)]
    return (said or lines or ["(no reason given)"])[-1]


def main(where):
    if where.endswith(".json"):
        path = where  # a run beside another in the same build directory: its own log (--logbase)
    else:
        # The last run's: meson names the log after the wrapper (testlog-valgrind.json for --wrap=valgrind…).
        logs = glob.glob(os.path.join(where, "meson-logs", "testlog*.json"))
        path = max(logs, key=os.path.getmtime, default=os.path.join(where, "meson-logs", "testlog.json"))
    try:
        with open(path) as f:
            tests = [json.loads(line) for line in f if line.strip()]
    except OSError as e:
        print(f"test-skips: cannot read {path}: {e.strerror}", file=sys.stderr)
        return 1
    skipped = 0
    for t in tests:
        name = t["name"].split(":", 1)[-1]  # "project:suite / test" → "suite / test"
        output = (t.get("stdout") or "") + "\n" + (t.get("stderr") or "")
        if t["result"] == "SKIP":
            print(f"SKIP  {name}: {why_skipped(output)}")
            skipped += 1
            continue
        for case, reason in TAP_CASE_SKIP.findall(output) + UNITTEST_SKIP.findall(output):
            print(f"skip  {name}: {case}: {reason}" if case else f"skip  {name}: {reason}")
    return 77 if tests and skipped == len(tests) else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
