#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-sentinel-fleet.py — what an idle fleet behind Sentinels costs the Sentinels (issue 21's fleet, the
high-availability side of bench-fleet.py).

A primary, a replica and three Sentinels (tests/integration/sentineld.py: loopback, private ports, stopped by
pid); N brokerds naming P shared pools each with `backend = redis-sentinel://S1,S2,S3/grid-redis`, every
other setting at its default, idle (no client). In one run:

  1. baseline: the Sentinels alone (they ping each other and the servers they watch) for BASELINE seconds;
  2. the N brokerds started, registered in every pool (ZCARD on the primary), SETTLE seconds more;
  3. a window of WINDOW seconds: each Sentinel's CPU (INFO cpu, used_cpu_sys + used_cpu_user) per second
     above its baseline, per brokerd; its clients (INFO clients) and the commands it answered (INFO stats'
     total_commands_processed) per brokerd per second.

Each brokerd keeps a connection to every Sentinel of its URL (its confirmation rounds', which carry its question
where the primary is too) and one more (its +switch-master subscription) to the one it asks: the first of the
URL for all of them. A brokerd that holds something asks every Sentinel once a second (a round); an idle one,
as here, lets its rounds rest and asks nothing (brokerd.conf(5), "High availability: Redis Sentinel").

Usage: bench-sentinel-fleet.py BROKERD [N [P]]   (default: 100 1)
Environment: BENCH_FLEET_WINDOW (seconds, default 30), BENCH_FLEET_BASELINE (default 15), BENCH_FLEET_SETTLE
(default 5). Exit 77 without redis-server or without shared pools in BROKERD. A benchmark, not a test: it fails
only when something under it fails (a brokerd dies or does not register).
"""
import importlib.util
import os
import shutil
import sys
import tempfile
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import sentineld  # noqa: E402
from harness import Broker, wait_for  # noqa: E402

# bench-fleet.py's helpers (its name has a hyphen: loaded by path).
_spec = importlib.util.spec_from_file_location("bench_fleet", os.path.join(HERE, "bench-fleet.py"))
fleet = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fleet)

WINDOW = float(os.environ.get("BENCH_FLEET_WINDOW", "30"))
BASELINE = float(os.environ.get("BENCH_FLEET_BASELINE", "15"))
SETTLE = float(os.environ.get("BENCH_FLEET_SETTLE", "5"))


def info(s, section):
    text = s.call("INFO", section)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#"))


def sample(sentinels):
    """Per Sentinel: (CPU seconds by INFO cpu, commands processed), and the monotonic time."""
    out = []
    for s in sentinels:
        cpu, stats = info(s, "cpu"), info(s, "stats")
        out.append((float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
                    int(stats["total_commands_processed"])))
    return out, time.monotonic()


def rates(sentinels, seconds):
    (a, t0) = sample(sentinels)
    time.sleep(seconds)
    (b, t1) = sample(sentinels)
    dt = t1 - t0
    return [((b[i][0] - a[i][0]) / dt, (b[i][1] - a[i][1]) / dt) for i in range(len(sentinels))], dt


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    brokerd = os.path.abspath(sys.argv[1])
    os.environ["BROKERD"] = brokerd
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    p = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    why = fleet.cannot_run()
    if why:
        print(f"SKIP: {why}")
        return 77
    tmp = tempfile.mkdtemp(prefix="bench-sentinel-fleet-")
    t = sentineld.Topology(tmp, sentinels=3, down_after=5.0)
    brokers = []
    pools = [f"fleet{j:02d}" for j in range(p)]
    try:
        t.start()
        print(f"bench-sentinel-fleet: {brokerd}; {n} brokerds x {p} shared pools behind 3 Sentinels; window "
              f"{WINDOW:.0f} s, baseline {BASELINE:.0f} s; load average {fleet.load()}", flush=True)
        base, secs = rates(t.sentinels, BASELINE)
        print("Sentinels alone: " + "; ".join(f"S{i + 1} {c * 1e6:.0f} us/s, {q:.1f} commands/s"
                                              for i, (c, q) in enumerate(base)), flush=True)
        for i in range(n):
            b = Broker(fleet.config(f"fleet-{i:03d}", pools, t.url()), name=f"bench-sentinel-{i:03d}", debug=False)
            brokers.append(b)
            b.start(wait=False)
        for b in brokers:
            b.wait_ready(timeout=120)
        wait_for(lambda: min(t.primary.call("ZCARD", f"{{sb:{pool}}}:nodes") for pool in pools) >= n,
                 timeout=180, interval=0.5, message=f"all {n} brokerds registered in all {p} pools")
        time.sleep(SETTLE)
        during, secs = rates(t.sentinels, WINDOW)
        dead = [b.name for b in brokers if not b.alive()]
        if dead:
            raise AssertionError(f"brokerds died: {dead}")
        total = 0.0
        for i, s in enumerate(t.sentinels):
            cpu = (during[i][0] - base[i][0]) / n
            total += cpu
            clients = int(info(s, "clients")["connected_clients"])
            print(f"  S{i + 1}: {during[i][0] * 1e6:.0f} us/s, {cpu * 1e6:.1f} us/s per brokerd above its baseline; "
                  f"{(during[i][1] - base[i][1]) / n:.2f} commands/s per brokerd; {clients} clients "
                  f"({clients / n:.2f} per brokerd)", flush=True)
        worst = max((during[i][0] - base[i][0]) / n for i in range(len(t.sentinels)))
        print(f"sentinel fleet {n}x{p}: the Sentinels' CPU per brokerd per second {total * 1e6:.1f} us in all, "
              f"{worst * 1e6:.1f} us on the busiest; one Sentinel core at {worst * 10000 * 100:.0f} % for 10,000 "
              f"brokerds; load average {fleet.load()}", flush=True)
        return 0
    except BaseException:
        fleet.print_dead(brokers)
        raise
    finally:
        fleet.stop_brokers(brokers)
        t.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
