#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tools/shared-demo.sh, the README's example of a pool shared by two runners, runs and shows what it says.

From the demo's output: every job ran once, through the node it was sent to; no two jobs held one slot at
once and at most the limit (2) were held across both nodes, as counted by the jobs' own lock directories;
the fencing tokens are unique; and each node's `slotctl status` lists the other node's lease by node name.
Skipped (77) without redis-server, or when the build has no shared pools (-Dredis=disabled).

Usage: test-shared-demo.py SOURCE_ROOT BUILD_ROOT HAVE_REDIS(1|0) [unittest arguments]
"""
import os
import re
import shutil
import subprocess
import sys
import unittest

sys.dont_write_bytecode = True
import harness  # noqa: E402

SOURCE_ROOT, BUILD_ROOT, HAVE_REDIS = sys.argv[1:4]
del sys.argv[1:4]

JOB = re.compile(r"^  (job-\d+) via (runner-[ab]): slot (\d+), fencing token (\d+) \((\d+) of 2 slots held\)$")


class TestSharedDemo(unittest.TestCase):
    def setUp(self):
        if HAVE_REDIS != "1":
            self.skipTest("built without shared pools (-Dredis=disabled)")
        if shutil.which("redis-server") is None:
            self.skipTest("redis-server is not installed (Debian: apt-get install redis-server)")

    def test_demo(self):
        env = dict(os.environ, SLOTBROKER_BUILD_DIR=BUILD_ROOT)
        env.pop("SLOTBROKER_SOCKET", None)
        demo = subprocess.run(["bash", os.path.join(SOURCE_ROOT, "tools", "shared-demo.sh")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
        out = demo.stdout
        self.assertEqual(demo.returncode, 0, out)
        self.assertNotIn("!!", out, "a slot was held by two jobs at once")

        jobs = [JOB.match(line).groups() for line in out.splitlines() if JOB.match(line)]
        self.assertEqual(sorted(j[0] for j in jobs), [f"job-{i}" for i in range(1, 7)], out)
        for name, node, slot, _, held in jobs:
            # Odd jobs go through runner-a, even ones through runner-b.
            self.assertEqual(node, "runner-a" if int(name[4:]) % 2 else "runner-b", out)
            self.assertIn(int(slot), (0, 1), out)
            self.assertLessEqual(int(held), 2, out)
        self.assertEqual(len({j[3] for j in jobs}), 6, "fencing tokens are unique in the pool")
        self.assertIn("most slots held at once, across both nodes: 2 (limit 2)", out)

        # Each node lists a lease of the other one, by name, under its own.
        for node, other in (("a", "b"), ("b", "a")):
            section = out.split(f"== slotctl status on runner-{node} ==", 1)[1].split("\n\n", 1)[0]
            self.assertIn("shared: backend up, 2 nodes", section, out)
            held_elsewhere = section.split("HELD ON NODE", 1)[1].splitlines()[1]
            self.assertTrue(held_elsewhere.split()[0] == f"runner-{other}", section)


if __name__ == "__main__":
    harness.main()
