#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-lua-profile.py — where a shared pool's pair (a submit granted at once, then its release) spends the
library's Lua instructions: by function (inclusive) and by line, and its redis.call()s by line.

Redis's Lua has no debug library, so the library (as brokerd embeds it: tools/embed-lua-library.py) runs in
lua5.1 instead (bench-lua-profile.lua), each redis.call() sent to a redis-server of its own (private port,
stopped by pid) and its reply converted as Redis converts it. A count hook samples every ~INTERVAL VM
instructions. What the figures leave out: what runs in C (each redis.call() is ~5.5 k instructions of
Redis's, cmsgpack, string.find()'s patterns, the reply's conversion, the garbage collector); for those,
bench-batch-cost.py's callgrind mode counts Redis's own instructions. Lines are the library's (the
prelude from line 4, then the operations), printed with their text.

Usage: bench-lua-profile.py [PAIRS] [B] [INTERVAL]   (defaults: 800, 8, 97; B pairs a batch, 1: calls alone)
Needs lua5.1, lua-bitop, lua-socket and lua-messagepack (Debian packages); skipped (77) without them.
A benchmark, not a test: it fails only when something under it fails.
"""
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlua  # noqa: E402
from benchlua import redisd  # noqa: E402

OPS = ["submit", "release", "withdraw", "tick", "reclaim", "drain", "positions", "batch"]
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench-lua-profile.lua")


def main():
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 800
    b = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    interval = int(sys.argv[3]) if len(sys.argv) > 3 else 97
    if redisd.REDIS_SERVER is None or not shutil.which("lua5.1"):
        print("SKIP: redis-server or lua5.1 is not installed")
        return 77
    probe = subprocess.run(["lua5.1", "-e", "require 'socket'; require 'bit'; require 'MessagePack'"],
                           capture_output=True)
    if probe.returncode != 0:
        print("SKIP: lua-socket, lua-bitop or lua-messagepack is not installed")
        return 77
    with benchlua.private_redis("bench-lua-profile-") as server:
        text, _ = benchlua.library(OPS, "bench-lua-profile.py")
        lib = os.path.join(server.dir, "library.lua")
        with open(lib, "w") as f:
            f.write("\n" + text.split("\n", 1)[1])  # the "#!lua" line is Redis's, not Lua's: blank, lines kept
        load = os.getloadavg()
        print(f"load average {load[0]:.2f} {load[1]:.2f} (instruction samples do not depend on it)", flush=True)
        return subprocess.run(["lua5.1", DRIVER, str(server.port), lib, str(pairs), str(b), str(interval)]).returncode


if __name__ == "__main__":
    sys.exit(main())
