#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-shared-cost.py — the instructions one brokerd executes per message (an Acquire granted at once, or
its Release) on a shared pool and on a local pool, counted by callgrind: load-independent, so that two
builds compare on a machine that other work loads (issue 21's "brokerd as cheap as the local path").

One redis-server (private Unix socket, no persistence, stopped by pid) and one brokerd run under
`valgrind --tool=callgrind --instr-atstart=no`, configured as bench-shared's node-a (pools shared-roomy
and local-roomy of 2 × CLIENTS slots: nobody waits; no debug log). After a warm-up (the shared pool's first
grant waits one backend-node-ttl), CLIENTS connections from one select() loop each go Acquire → granted
→ Release → released, PAIRS pairs in all, first on the shared pool, then on the local one; instrumentation
is on only during those runs (callgrind_control -i), and each run is dumped apart. The Ir of each dump
(every instruction brokerd ran in that window, all its threads) is divided by 2 × PAIRS.

Usage: bench-shared-cost.py BROKERD [PAIRS [CLIENTS [OUTDIR]]]   (defaults 3000, 32; OUTDIR keeps the
callgrind files for callgrind_annotate, else a temporary directory removed at the end)
With $BENCH_SHARED_COST_CPU=1, brokerd runs without valgrind and the figure is its CPU time per message
instead (all its threads, /proc/PID/task/*/schedstat: user and kernel, so a loaded machine moves it).
A benchmark, not a test: it fails only when something under it fails. Skipped (77) without valgrind or
redis-server.
"""
import glob
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import redisd  # noqa: E402
from harness import Varlink, acquire  # noqa: E402

TTL = 6
CPU_ONLY = os.environ.get("BENCH_SHARED_COST_CPU") == "1"


def wrapper(tmp, brokerd, outdir):
    path = os.path.join(tmp, "brokerd-callgrind.sh")
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexec valgrind --tool=callgrind --instr-atstart=no --separate-threads=no "
                f"--callgrind-out-file={outdir}/callgrind.out.%p '{brokerd}' \"$@\"\n")
    os.chmod(path, 0o755)
    return path


def config(redis_url, clients):
    return ("[broker]\nnode-name=node-a\nrevoke-grace=1s\n"
            f"max-connections={4 * clients + 64}\nmax-connections-per-uid={4 * clients + 64}\n"
            f"max-waiters-per-uid={2 * clients + 64}\n"
            "max-acquire-rate=infinity\nmax-acquire-rate-per-uid=infinity\n"
            f"[pool shared-roomy]\nlimit={2 * clients}\nbackend={redis_url}\nbackend-node-ttl={TTL}s\n"
            "[lane shared-roomy]\npools=shared-roomy\npolicy=wait\n"
            f"[pool local-roomy]\nlimit={2 * clients}\n[lane local-roomy]\npools=local-roomy\npolicy=wait\n")


def first_grant(sock, lane, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        a = acquire(sock, lane, timeout=timeout)
        try:
            lease = a.until_granted(timeout) if not a.error else None
        except AssertionError:
            lease = None
        if lease:
            a.conn.send("io.slotbroker.Release", {"lease": lease["id"]})
            a.until(lambda x: not x.continues, timeout, "the released")
            a.conn.recv(timeout)
            a.close()
            return
        a.close()
        time.sleep(0.2)
    raise SystemExit(f"bench-shared-cost: no grant on {lane} within {timeout} s")


class Client:
    def __init__(self, sock, lane):
        self.conn = Varlink(sock, 120)
        self.lane = lane
        self.state = None

    def start(self):
        self.conn.send("io.slotbroker.Acquire", {"lane": self.lane}, more=True)
        self.state = "acquiring"

    def on_message(self, msg):
        """True when a pair ended."""
        if msg.get("error"):
            raise SystemExit(f"bench-shared-cost: {self.lane}: {msg}")
        params = msg.get("parameters") or {}
        if self.state == "acquiring":
            if params.get("state") == "granted":
                self.conn.send("io.slotbroker.Release", {"lease": params["lease"]["id"]})
                self.state = "releasing"
                self.got = 0
            return False
        self.got += 1  # the Acquire's end, then the Release's reply
        if self.got == 2:
            self.start()
            return True
        return False


def run_pairs(sock, lane, clients, pairs):
    cs = [Client(sock, lane) for _ in range(clients)]
    by_fd = {c.conn.fileno(): c for c in cs}
    for c in cs:
        c.start()
    done = 0
    t0 = time.monotonic()
    while done < pairs:
        r, _, _ = select.select(list(by_fd), [], [], 60)
        if not r:
            raise SystemExit("bench-shared-cost: brokerd stopped answering")
        for fd in r:
            c = by_fd[fd]
            msg = c.conn.recv(60)
            if c.on_message(msg):
                done += 1
            while (msg := c.conn._take()) is not None:  # the rest of what that read brought
                if c.on_message(msg):
                    done += 1
    elapsed = time.monotonic() - t0
    for c in cs:
        c.conn.close()
    return done, elapsed


def fcalls(redis):
    stat = redis.info("commandstats").get("cmdstat_fcall", "calls=0")
    return int(re.match(r"calls=(\d+)", stat).group(1))


def cpu_ns(pid):
    total = 0
    for task in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(task) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return total


def control(pid, *args):
    if CPU_ONLY:
        return
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, stdout=subprocess.DEVNULL)


def total_ir(path):
    with open(path) as f:
        for line in f:
            m = re.match(r"totals:\s+(\d+)", line)
            if m:
                return int(m.group(1))
    raise SystemExit(f"bench-shared-cost: no totals in {path}")


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    brokerd = os.path.abspath(sys.argv[1])
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    clients = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    if (not CPU_ONLY and (not shutil.which("valgrind") or not shutil.which("callgrind_control"))) or \
            redisd.REDIS_SERVER is None:
        print("bench-shared-cost: no valgrind or redis-server: skipped")
        return 77
    tmp = tempfile.mkdtemp(prefix="bench-shared-cost-")
    outdir = os.path.abspath(sys.argv[4]) if len(sys.argv) > 4 else os.path.join(tmp, "out")
    os.makedirs(outdir, exist_ok=True)
    redis = redisd.RedisServer(tmp).start()
    sock = os.path.join(tmp, "io.slotbroker")
    conf = os.path.join(tmp, "brokerd.conf")
    with open(conf, "w") as f:
        f.write(config(redis.url(), clients))
    log = open(os.path.join(tmp, "brokerd.log"), "wb")
    proc = subprocess.Popen([brokerd if CPU_ONLY else wrapper(tmp, brokerd, outdir), "--config", conf, "--socket", sock, "--state-directory",
                             os.path.join(tmp, "state")], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(sock):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("bench-shared-cost: brokerd did not start:\n" + open(log.name).read()[-3000:])
            time.sleep(0.1)
        first_grant(sock, "shared-roomy", TTL + 120)
        first_grant(sock, "local-roomy", 120)
        run_pairs(sock, "shared-roomy", clients, max(pairs // 10, clients))
        run_pairs(sock, "local-roomy", clients, max(pairs // 10, clients))
        figures = {}
        for lane in ("shared-roomy", "local-roomy"):
            control(proc.pid, "-z")
            control(proc.pid, "-i", "on")
            calls = fcalls(redis)
            cpu = cpu_ns(proc.pid)
            done, elapsed = run_pairs(sock, lane, clients, pairs)
            cpu = cpu_ns(proc.pid) - cpu
            control(proc.pid, "-i", "off")
            calls = fcalls(redis) - calls
            before = set(glob.glob(f"{outdir}/callgrind.out.{proc.pid}*"))
            control(proc.pid, "--dump=" + lane)
            new = sorted(set(glob.glob(f"{outdir}/callgrind.out.{proc.pid}*")) - before)
            ir = cpu / 1000 if CPU_ONLY else sum(total_ir(p) for p in new)
            figures[lane] = (ir, done, elapsed, new, calls)
        print(f"bench-shared-cost: {pairs} pairs, {clients} clients, brokerd {brokerd}")
        for lane, (ir, done, elapsed, files, calls) in figures.items():
            print(f"  {lane}: {ir / (2 * done):,.{2 if CPU_ONLY else 0}f} {'us of CPU' if CPU_ONLY else 'Ir'} per message ({done} pairs, {done / elapsed:.0f} pairs/s{'' if CPU_ONLY else ' under callgrind'}, "
                  f"{2 * done / calls if calls else 0:.1f} messages per FCALL; "
                  f"{', '.join(os.path.basename(p) for p in files)})")
        s, l_ = figures["shared-roomy"], figures["local-roomy"]
        print(f"  shared - local: {(s[0] / (2 * s[1])) - (l_[0] / (2 * l_[1])):,.2f} {'us' if CPU_ONLY else 'Ir'} per message"
              f"; load average {open('/proc/loadavg').read().strip()}")
        print(json.dumps({k: v[0] / (2 * v[1]) for k, v in figures.items()}))
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        redis.stop()
        if len(sys.argv) <= 4:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
