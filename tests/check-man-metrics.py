#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Every metric family that brokerd/metrics.c writes is listed in brokerd(8) METRICS, with its type, and
nothing else is.

The source names each family beside its type (`"slotbroker_x", "counter"`: header()'s calls and the tables);
a family written without one (a name in a string that starts a sample) fails too. The man page has an
entry `*slotbroker_x* (TYPE)` on a line of its own under "# METRICS". A family added, renamed or retyped in
the code without its documentation fails here, and so does an entry left for a family that is gone.

Usage: check-man-metrics.py METRICS_C BROKERD_8_SCD
"""
import re
import sys

TYPES = "gauge|counter|histogram"


def source_families(source):
    typed = {}
    for name, kind in re.findall(r'"(slotbroker_[a-z_]+)",\s*"(' + TYPES + r')"', source):
        if typed.setdefault(name, kind) != kind:
            sys.exit(f"{name} is given two types in the source")
    # Samples written by hand: "slotbroker_x %llu\n", "slotbroker_x{pool=…".
    written = set(re.findall(r'"(slotbroker_[a-z_]+)[ {]', source))
    return typed, written - set(typed)


def page_families(page):
    m = re.search(r"^# METRICS\n(.*?)^# ", page, re.S | re.M)
    if not m:
        sys.exit("no METRICS section in the page")
    entries = re.findall(r"^\*(slotbroker_[a-z_]+)\* \((" + TYPES + r")\)$", m.group(1), re.M)
    documented = {}
    for name, kind in entries:
        if name in documented:
            sys.exit(f"{name} is listed twice in METRICS")
        documented[name] = kind
    return documented


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        typed, untyped = source_families(f.read())
    with open(sys.argv[2]) as f:
        documented = page_families(f.read())
    if not typed:
        sys.exit("no family found in the source: the pattern no longer matches it")
    problems = [f"written without a type beside its name in the source: {n}" for n in sorted(untyped)]
    for name, kind in sorted(typed.items()):
        if name not in documented:
            problems.append(f"not in brokerd(8) METRICS: {name} ({kind})")
        elif documented[name] != kind:
            problems.append(f"{name} is a {kind}, brokerd(8) says {documented[name]}")
    problems += [f"in brokerd(8) METRICS, not written by brokerd: {n}" for n in sorted(set(documented) - set(typed))]
    for p in problems:
        print(p)
    print(f"{len(typed)} families checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
