#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""slotctl loads libc alone: what each CI job pays for at every `slotctl run`.

Every shared library a program needs costs each of its starts the loader's work (the file mapped, its
relocations, the copy-on-write faults of its data): ~50 µs a library on a VM, which is as much as brokerd's
own part of a grant (tests/bench/README.md, stop 49). slotctl links jansson and inih from their static
archives and dlopen()s libsqlite3 for `simulate --replay` only (cli/meson.build); a dependency added the
ordinary way would show up here as a new DT_NEEDED entry, and fail.

Usage: check-slotctl-libraries.py SLOTCTL
       check-slotctl-libraries.py --self-test
Exit 77 (skip) without readelf.
"""
import re
import shutil
import subprocess
import sys

ALLOWED = {"libc.so.6"}


def needed(path):
    out = subprocess.run(["readelf", "--dynamic", "--wide", path], check=True, capture_output=True,
                         text=True).stdout
    return sorted(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))


def check(libs):
    """The libraries beyond ALLOWED, an empty list when there is none."""
    return [lib for lib in libs if lib not in ALLOWED]


def self_test():
    assert check(["libc.so.6"]) == []
    assert check(["libjansson.so.4", "libc.so.6"]) == ["libjansson.so.4"]
    # The parser reads readelf's own format: the running python3 needs libc at least.
    assert "libc.so.6" in needed(sys.executable)
    print("ok")


def main():
    if shutil.which("readelf") is None:
        print("readelf not found: skipped")
        return 77
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    libs = needed(sys.argv[1])
    if not libs:
        print(f"{sys.argv[1]}: no DT_NEEDED entry at all (not a dynamic executable?)", file=sys.stderr)
        return 1
    extra = check(libs)
    if extra:
        print(f"{sys.argv[1]} loads {', '.join(extra)} at every start: link it statically or dlopen() it "
              "where it is used (cli/meson.build)", file=sys.stderr)
        return 1
    print(f"{sys.argv[1]}: {', '.join(libs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
