#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""libbroker.so exports exactly the versioned symbols of debian/libbroker1.symbols, and each can be called.

A symbol of a released node that goes missing (LIBBROKER_1's broker_acquire once LIBBROKER_2 took the
name) breaks every program linked against it; one exported that the file does not list is an ABI change
that nobody wrote down. Both fail here. Then every function version is looked up with dlvsym(3), and
broker_acquire and broker_acquire_start of each version are called with a NULL client: each must answer
-EINVAL, as a function of the library (not a stray address) does.

Usage: check-libbroker-abi.py LIBBROKER_SO SYMBOLS_FILE
Exit 77 (skip) without readelf.
"""
import ctypes
import errno
import re
import shutil
import subprocess
import sys


def exported(so):
    out = subprocess.run(["readelf", "--dyn-syms", "--wide", so], check=True, capture_output=True,
                         text=True).stdout
    syms = {}
    for line in out.splitlines():
        f = line.split()
        # Num: Value Size Type Bind Vis Ndx Name
        if len(f) < 8 or f[4] != "GLOBAL" or f[6] == "UND":
            continue
        name = f[7].replace("@@", "@")
        if f[6] == "ABS" and "@" not in name:
            name = f"{name}@{name}"  # a version node's own symbol, as dpkg-gensymbols lists it
        if "@" not in name:
            raise SystemExit(f"{so}: {name} is exported without a version")
        syms[name] = f[3]
    return syms


def listed(path):
    syms = set()
    with open(path) as f:
        for line in f:
            m = re.match(r"^ (\S+@\S+) \S+", line)
            if m:
                syms.add(m.group(1))
    return syms


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    so, symbols = sys.argv[1:]
    if not shutil.which("readelf"):
        print("readelf not found: skipped")
        return 77
    got = exported(so)
    want = listed(symbols)
    ok = True
    for s in sorted(want - set(got)):
        print(f"{so}: {s} is listed in {symbols} but not exported (a released version removed?)")
        ok = False
    for s in sorted(set(got) - want):
        print(f"{so}: {s} is exported but not listed in {symbols} (an ABI change: list it)")
        ok = False

    lib = ctypes.CDLL(so)
    libc = ctypes.CDLL(None)
    libc.dlvsym.restype = ctypes.c_void_p
    libc.dlvsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    for s, kind in sorted(got.items()):
        name, version = s.split("@")
        if kind != "FUNC":
            continue
        addr = libc.dlvsym(lib._handle, name.encode(), version.encode())
        if not addr:
            print(f"{so}: dlvsym({name}, {version}) finds nothing")
            ok = False
            continue
        if name in ("broker_acquire", "broker_acquire_start"):
            args = [ctypes.c_void_p] * (3 if name == "broker_acquire" else 2)
            f = ctypes.CFUNCTYPE(ctypes.c_int, *args)(addr)
            r = f(*([None] * len(args)))
            if r != -errno.EINVAL:
                print(f"{so}: {s}(NULL, …) returned {r}, not -EINVAL")
                ok = False
    for version in sorted({s.split("@")[1] for s in want}):
        if not any(s.startswith(("broker_",)) and s.endswith("@" + version) for s in got):
            print(f"{so}: version node {version} has no function")
            ok = False
    print("ok" if ok else "failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
