#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-sentinel-wake.py — what the first request after an idle spell waits behind Redis Sentinel: the round
it wakes (brokerd.conf(5): an idle runner's confirmation rounds rest, and a request waits for the round it
starts once the last confirmation is 3 s old), with the three Sentinels answering, and with one of them hung.

One primary, three Sentinels and one brokerd on backend = redis-sentinel://…, all on private loopback ports
(tests/integration/sentineld.py). Each sample waits until the last confirmation is over 3.5 s old (the rounds
resting), then times a fail-fast Acquire from its call to its grant, and releases it. In the hung samples the
third Sentinel of the URL gets SIGSTOP just before the Acquire (its connection stays up: it is asked, and never
answers) and SIGCONT after the grant. Medians are printed for both kinds, alternated.

Usage: bench-sentinel-wake.py BROKERD [SAMPLES]   (default 6 of each kind; ~1 minute a pair of samples)
A benchmark, not a test: it fails only when something under it fails.
"""
import importlib.util
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import redisd  # noqa: E402
from harness import Broker, wait_for  # noqa: E402
from sentineld import Topology  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "bench_sentinel", os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench-sentinel.py"))
bench_sentinel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_sentinel)

CONFIG = """\
[broker]
revoke-grace = 1s

[pool grid]
limit = 1
backend = {backend}
backend-node-ttl = 6s

[lane grid]
pools = grid
policy = fail-fast
"""


def resting(b):
    backend = b.pool("grid").get("backend") or {}
    return backend.get("up") and backend.get("confirmedAgoMs", 0) > 3500


def sample(b):
    """Seconds from a fail-fast Acquire's call to its grant (the lease released after)."""
    t0 = time.monotonic()
    a = b.acquire("grid", timeout=10)
    try:
        if not a.granted:
            raise AssertionError(f"not granted: {a.msg!r}")
        return a.times[-1] - t0
    finally:
        a.close()


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    os.environ["BROKERD"] = os.path.abspath(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    if redisd.REDIS_SERVER is None:
        print("SKIP: redis-server is not installed")
        return 77
    tmp = tempfile.mkdtemp(prefix="bench-sentinel-wake-")
    topo = Topology(tmp, sentinels=3, down_after=1.0).start()
    b = Broker(CONFIG.format(backend=topo.url()), name="bench-sentinel-wake", debug=False).start()
    hung = topo.sentinels[2].proc
    times = {"answering": [], "one hung": []}
    try:
        wait_for(lambda: (b.pool("grid").get("backend") or {}).get("up"), timeout=60, message="the pool served")
        # The pool's first grant, after its first-use window (a recovery window of one TTL), is not a wake.
        bench_sentinel.first_grant(b, time.monotonic() + 60)
        for i in range(2 * n):
            kind = "answering" if i % 2 == 0 else "one hung"
            wait_for(lambda: resting(b), timeout=30, interval=0.1, message="the rounds resting")
            if kind == "one hung":
                hung.send_signal(signal.SIGSTOP)
            try:
                times[kind].append(sample(b))
            finally:
                if kind == "one hung":
                    hung.send_signal(signal.SIGCONT)
            print(f"{kind}: granted after {times[kind][-1] * 1000:.2f} ms", flush=True)
        load = os.getloadavg()[0]
        print("the first fail-fast Acquire after 3.5 s idle, call to grant: " +
              "; ".join(f"{k} median {statistics.median(v) * 1000:.2f} ms (min {min(v) * 1000:.2f}, "
                        f"max {max(v) * 1000:.2f})" for k, v in times.items()) +
              f"; {n} samples each; load average {load:.2f}")
    finally:
        if hung.poll() is None:
            hung.send_signal(signal.SIGCONT)
        b.stop()
        b.cleanup()
        topo.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
