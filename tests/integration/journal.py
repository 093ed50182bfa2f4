#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""journal.py — reading back what brokerd sent to journald, for the tests that run inside journald-ns.sh (a
private journald in mount and pid namespaces of their own), and the journal catalog as journalctl reads it.

    journal.require_private_journald()          # unittest.SkipTest outside journald-ns.sh
    journal.entries("SLOT_POOL=p", f"_PID={pid}")
    journal.read_catalog(".../units/slotbroker.catalog")   # {MESSAGE_ID: Subject}

Python 3 standard library only; imported beside harness.py.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

DIRECTORY = os.environ.get("JOURNALD_NS_DIRECTORY", "/run/log/journal")
JOURNALD_PID = int(os.environ.get("JOURNALD_NS_PID", "0"))


def require_private_journald():
    """Raises unittest.SkipTest unless run by journald-ns.sh: the machine's own journal is never read (nor
    written to by a test on purpose), so that what a test finds there is its own brokerd's."""
    if not JOURNALD_PID or not os.path.isdir(DIRECTORY):
        raise unittest.SkipTest("not inside journald-ns.sh: no private journald")


def entries(*matches):
    """Entries matching FIELD=value arguments (ANDed across fields), oldest first, as dicts."""
    p = subprocess.run(["journalctl", "-D", DIRECTORY, "-o", "json", "--no-pager", *matches],
                       capture_output=True, text=True, timeout=30)
    if p.returncode != 0 and p.stdout.strip():
        raise AssertionError(f"journalctl {matches}: {p.stderr}")
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


def read_catalog(path):
    """{MESSAGE_ID: Subject} of the catalog, as systemd's own parser reads it (journalctl --update-catalog
    into a scratch root: the machine's catalog database is not touched), checked against a plain parse."""
    root = tempfile.mkdtemp(prefix="catalog-")
    try:
        os.makedirs(os.path.join(root, "usr/lib/systemd/catalog"))
        shutil.copy(path, os.path.join(root, "usr/lib/systemd/catalog/slotbroker.catalog"))
        subprocess.run(["journalctl", f"--root={root}", "--update-catalog"], check=True, capture_output=True)
        listed = subprocess.run(["journalctl", f"--root={root}", "--list-catalog"], check=True, capture_output=True,
                                text=True).stdout
    finally:
        shutil.rmtree(root, ignore_errors=True)
    parsed = {}
    for line in listed.splitlines():
        mid, _, subject = line.partition(" ")
        parsed[mid] = subject.removeprefix("slotbroker: ")
    with open(path) as f:
        plain = re.findall(r"^-- ([0-9a-f]{32})$", f.read(), re.M)
    if sorted(plain) != sorted(parsed) or len(plain) != len(set(plain)):
        raise AssertionError(f"journalctl reads the catalog's ids as {sorted(parsed)}, the file has {plain}")
    return parsed
