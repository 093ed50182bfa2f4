#!/usr/bin/env python3
"""bench-idle-connections.py [WINDOW_S] [N] — what idle connections alone cost a redis-server.

An idle brokerd keeps two connections per backend (its command link, and its stream link blocked in XREAD):
is what Redis spends on them (its cron visits every client about once a second) a part of bench-fleet.py's
idle figure worth a change? On a private redis-server (tests/integration/redisd.py: loopback, a free port,
stopped by pid), Redis's CPU (INFO cpu, sys + user) over windows of WINDOW_S seconds (default 30): with no
client (twice: the spread of the idle server itself), with N idle connections (default 100), and with N more
blocked in XREAD BLOCK on 10 streams each, as a brokerd naming 10 shared pools keeps them. Prints each
window's µs/s and the difference per connection; read it against the two no-client windows' difference.
"""
import os
import socket
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import redisd  # noqa: E402


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_seconds(r):
    i = r.info("cpu")
    return float(i["used_cpu_sys"]) + float(i["used_cpu_user"])


def window(r, seconds, label, per=0):
    a, t = cpu_seconds(r), time.monotonic()
    time.sleep(seconds)
    us = (cpu_seconds(r) - a) / (time.monotonic() - t) * 1e6
    print(f"{label}: {us:.0f} us/s" + (f" ({us / per:.1f} per connection)" if per else "") +
          f"; load average {load()}", flush=True)
    return us


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    if redisd.REDIS_SERVER is None:
        print("bench-idle-connections: no redis-server here")
        return 77
    r = redisd.RedisServer(tempfile.mkdtemp(prefix="bench-idle-connections-"), port=0, unix=False).start()
    conns = []
    try:
        print(f"redis-server pid {r.pid} on 127.0.0.1:{r.port}; windows of {seconds:g} s; load average {load()}")
        time.sleep(1)
        none = [window(r, seconds, "no client"), window(r, seconds, "no client, again")]
        for _ in range(n):
            conns.append(socket.create_connection(r.tcp_address))
        idle = window(r, seconds, f"{n} idle connections")
        for i in range(n):
            s = socket.create_connection(r.tcp_address)
            keys = [f"{{sb:p{j}}}:s:n{i}" for j in range(10)]
            s.sendall(redisd.encode_command("XREAD", "BLOCK", 3600 * 1000, "STREAMS", *keys, *(["$"] * 10)))
            conns.append(s)
        blocked = window(r, seconds, f"{n} idle and {n} blocked in XREAD")
        print(f"per connection: idle {(idle - sum(none) / 2) / n:.1f} us/s, blocked in XREAD "
              f"{(blocked - idle) / n:.1f} us/s; the idle server's own spread {abs(none[1] - none[0]) / n:.1f} "
              f"us/s per connection's share")
    finally:
        for s in conns:
            s.close()
        r.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
