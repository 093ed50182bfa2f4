#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-fleet.py — what an idle fleet costs one Redis (issue 21, item 4; SPEC §12).

N brokerds, each naming the same P shared pools (`backend = redis://127.0.0.1:PORT`, every other setting at
its default: backend-node-ttl 30 s), idle on one private redis-server (tests/integration/redisd.py: loopback,
a free port, no persistence, stopped by its pid). Each brokerd has its own state directory (so its own
node-id), socket and node-name. Per configuration NxP, in one run and one Redis:

  1. baseline: Redis with no client for BASELINE seconds: its own CPU (serverCron, ...);
  2. reference: a plain lease semaphore in the same Redis, N x P idle holders: one connection per
     simulated node, which renews each of its P leases (one per pool) once a second, spread over the
     second: `ZADD {sem:POOL} EXPIRY_MS NODE` + `PEXPIRE {sem:POOL} 30000` sent together, both replies read
     before that connection's next renewal (what a holder's heartbeat costs in the cheapest Redis lease
     semaphore: the sorted set of issue 21's first row, without the acquire's ZREMRANGEBYSCORE + ZCARD);
     then the floor of any liveness per node: one `ZADD {sem:nodes} EXPIRY_MS NODE` per simulated node per
     second (one command, one round trip), N connections;
  3. the N brokerds started, and once every one is registered in every pool (ZCARD {sb:POOL}:nodes = N)
     and the first use's recovery window (one backend-node-ttl, 30 s, from the first brokerd's start) and
     SETTLE seconds more have passed, and every brokerd keeps one connection (an idle one closes its stream
     link: 45 s at most), a window of WINDOW seconds in three parts.

Redis's CPU is INFO cpu's used_cpu_sys + used_cpu_user (getrusage of the whole process, microseconds),
read at each window's edges; /proc/PID/stat's utime + stime is printed beside it as a check. The figure is
(Redis CPU per second in the window - the baseline's) / N: Redis CPU per brokerd per second, against the
same for a simulated semaphore node; their ratio is the reference ratio (target: brokerd <= 20 us/s whatever
P <= 20, issue 21). Also printed: the commands per brokerd per second and their time (INFO commandstats,
reset at the window's start), the brokerds' own CPU, RSS and open fds, the load average.

Usage: bench-fleet.py BROKERD [NxP ...]     (default: 100x10 20x20)
Environment: BENCH_FLEET_WINDOW (seconds, default 30), BENCH_FLEET_BASELINE (default 15),
BENCH_FLEET_SETTLE (default 5), BENCH_FLEET_TRIPS=1 (after the floor, three more references of one round trip
per node per second each: an INFO as the command link's watch sends it, a ZADD and that INFO pipelined, an
XREAD BLOCK that times out; each as a ratio to the floor: what each of an idle brokerd's round trips costs
here). The INFOs in the commands per brokerd are theirs (the bench's own are left out). Exit 77 without redis-server or without shared pools in BROKERD.
A benchmark, not a test: it fails only when something under it fails (a brokerd dies, does not register
or leaves the pool; Redis answers the semaphore with an error).
"""
import heapq
import os
import selectors
import shutil
import signal
import socket
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import redisd  # noqa: E402
from harness import Broker, wait_for  # noqa: E402

WINDOW = float(os.environ.get("BENCH_FLEET_WINDOW", "30"))
BASELINE = float(os.environ.get("BENCH_FLEET_BASELINE", "15"))
SETTLE = float(os.environ.get("BENCH_FLEET_SETTLE", "5"))
TRIPS = os.environ.get("BENCH_FLEET_TRIPS", "") not in ("", "0")
PARTS = 3
NODE_TTL = 30.0  # backend-node-ttl's default, left at it
SEM_TTL_MS = 30000  # the lease semaphore's TTL, as backend-node-ttl's default
CLK_TCK = os.sysconf("SC_CLK_TCK")


def config(node, pools, backend):
    text = f"[broker]\nnode-name = {node}\n"
    for p in pools:
        text += f"\n[pool {p}]\nlimit = 8\nbackend = {backend}\n"
    text += f"\n[lane ci]\npools = {' '.join(pools)}\npolicy = wait\n"
    return text


def load():
    return "%.2f %.2f %.2f" % os.getloadavg()


def redis_cpu(r):
    """Redis's CPU (s) by its own account (INFO cpu) and by /proc/PID/stat."""
    info = r.info("cpu")
    with open(f"/proc/{r.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
            (int(fields[11]) + int(fields[12])) / CLK_TCK)


def commandstats(r):
    """INFO commandstats as {command: (calls, usec)}."""
    out = {}
    for k, v in r.info("commandstats").items():
        if k.startswith("cmdstat_"):
            f = dict(x.split("=", 1) for x in v.split(","))
            out[k[len("cmdstat_"):]] = (int(f["calls"]), int(f["usec"]))
    return out


def proc_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def measure(r, seconds, during=None):
    """Redis CPU (INFO, /proc) over `seconds` (running `during(deadline)` meanwhile, else sleeping), and
    the commandstats of that time. Returns (seconds actually elapsed, cpu_info_s, cpu_proc_s, stats)."""
    r.call("CONFIG", "RESETSTAT")
    c0, p0 = redis_cpu(r)
    t0 = time.monotonic()
    if during:
        during(t0 + seconds)
    else:
        time.sleep(seconds)
    c1, p1 = redis_cpu(r)
    t1 = time.monotonic()
    return t1 - t0, c1 - c0, p1 - p0, commandstats(r)


# INFO commands measure() itself sends after its CONFIG RESETSTAT (INFO cpu twice, INFO commandstats).
OWN_INFO = 3


def stats_line(stats, seconds, per, own_info=0):
    """The commands (less ours: CONFIG, and own_info INFOs) as calls per `per` per second and their µs per
    call. The INFOs left are the brokerds' (their command links watch the policy, role and run id)."""
    rows = []
    for cmd, (calls, usec) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
        if cmd in ("config|resetstat", "config", "ping"):
            continue
        if cmd == "info":
            if calls <= own_info:
                continue
            usec -= usec * own_info // calls  # ours at the average: theirs is what is left
            calls -= own_info
        rows.append(f"{cmd} {calls / seconds / per:.2f}/s × {usec / max(calls, 1):.1f} us")
    return "; ".join(rows) or "none"


def reply_end(buf, at=0):
    """Where the RESP reply starting at `at` ends in buf (None: not all there yet); an error reply raises."""
    nl = buf.find(b"\r\n", at)
    if nl < 0:
        return None
    kind, line = buf[at:at + 1], buf[at + 1:nl]
    if kind == b"-":
        raise AssertionError(f"redis-server answered the reference with an error: {line[:200]!r}")
    if kind in (b":", b"+"):
        return nl + 2
    n = int(line)
    if kind == b"$":
        return nl + 2 if n < 0 else (nl + 4 + n if len(buf) >= nl + 4 + n else None)
    end = nl + 2
    for _ in range(max(n, 0)):
        end = reply_end(buf, end)
        if end is None:
            return None
    return end


# The round trips a node makes, each alone on its connection once a second (BENCH_FLEET_TRIPS=1): what
# one costs Redis here, against the floor (a ZADD) measured in the same run. "info": the command link's
# watch (redis-link.c); "zadd+info": the two pipelined (a renewal carrying the watch); "xread": a blocking
# read of the node's stream that times out (the reader link's XREAD BLOCK, here of 1 s, on an empty
# stream).
ROUND_TRIPS = {
    "zadd": ("1 ZADD per node", lambda expiry, node: [("ZADD", "{sem:nodes}", expiry, node)]),
    "info": ("1 INFO server memory replication per node",
             lambda expiry, node: [("INFO", "server", "memory", "replication")]),
    "zadd+info": ("1 ZADD + INFO pipelined per node",
                  lambda expiry, node: [("ZADD", "{sem:nodes}", expiry, node),
                                        ("INFO", "server", "memory", "replication")]),
    "xread": ("1 XREAD BLOCK timing out per node",
              lambda expiry, node: [("XREAD", "BLOCK", "1000", "STREAMS", f"{{sem:s}}:{node}", "$")]),
}


class Semaphore:
    """The reference: n_nodes connections, each renewing its n_pools leases once a second (see the module's
    docstring). run(deadline) drives them from one selectors loop; renewals counts the completed ones."""

    def __init__(self, address, n_nodes, pools, node_only=False):
        self.pools = pools
        # node_only: one round trip per node per second instead, of the kind it names (ROUND_TRIPS); True:
        # "zadd", `ZADD {sem:nodes} EXPIRY NODE` (the floor)
        self.node_only = "zadd" if node_only is True else node_only
        self.conns = []
        self.sel = selectors.DefaultSelector()
        for i in range(n_nodes):
            s = socket.create_connection(address)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
            c = {"sock": s, "node": f"node-{i}", "queue": [], "busy": False, "buf": b"", "want": 0}
            self.conns.append(c)
            self.sel.register(s, selectors.EVENT_READ, c)
        self.renewals = 0
        self.late = 0  # renewals sent more than 100 ms after they were due (the driver could not keep up)

    def close(self):
        for c in self.conns:
            self.sel.unregister(c["sock"])
            c["sock"].close()
        self.sel.close()

    def _send(self, c, pool):
        expiry = int(time.time() * 1000) + SEM_TTL_MS
        if self.node_only:
            cmds = ROUND_TRIPS[self.node_only][1](expiry, c["node"])
            c["sock"].sendall(b"".join(redisd.encode_command(*cmd) for cmd in cmds))
            c["want"] = len(cmds)
        else:
            key = f"{{sem:{pool}}}"
            c["sock"].sendall(redisd.encode_command("ZADD", key, expiry, c["node"])
                              + redisd.encode_command("PEXPIRE", key, SEM_TTL_MS))
            c["want"] = 2
        c["busy"] = True

    def run(self, deadline, start=None):
        n, p = len(self.conns), 1 if self.node_only else len(self.pools)
        start = start or time.monotonic()
        heap = [(start + (i * p + j) / (n * p), i, j) for i in range(n) for j in range(p)]
        heapq.heapify(heap)
        while True:
            now = time.monotonic()
            if now >= deadline:
                break
            while heap and heap[0][0] <= now:
                due, i, j = heapq.heappop(heap)
                heapq.heappush(heap, (due + 1.0, i, j))
                c = self.conns[i]
                if now - due > 0.1:
                    self.late += 1
                if c["busy"]:
                    c["queue"].append(j)
                else:
                    self._send(c, self.pools[j])
            timeout = max(0.0, min(heap[0][0], deadline) - time.monotonic())
            for key, _ in self.sel.select(timeout):
                c = key.data
                data = c["sock"].recv(65536)
                if not data:
                    raise AssertionError("redis-server closed a semaphore connection")
                c["buf"] += data
                while c["want"]:
                    end = reply_end(c["buf"])
                    if end is None:
                        break
                    c["buf"] = c["buf"][end:]
                    c["want"] -= 1
                if c["busy"] and not c["want"]:
                    c["busy"] = False
                    self.renewals += 1
                    if c["queue"]:
                        self._send(c, self.pools[c["queue"].pop(0)])
        # Let the last replies arrive (not counted in the window: they were sent inside it).
        for c in self.conns:
            c["sock"].setblocking(True)
            c["sock"].settimeout(5)
            while c["want"]:
                end = reply_end(c["buf"])
                if end is None:
                    c["buf"] += c["sock"].recv(65536)
                    continue
                c["buf"] = c["buf"][end:]
                c["want"] -= 1
            c["sock"].setblocking(False)
            c["busy"], c["queue"] = False, []


def reference(r, n, pools, base, node_only):
    """Runs the semaphore (or, node_only, the one-command-per-node floor) for WINDOW seconds; prints and
    returns Redis's CPU per simulated node per second above the baseline."""
    sem = Semaphore(r.tcp_address, n, pools, node_only)
    try:
        sem.run(time.monotonic() + 2.0)  # every lease in place, the connections warm
        sem.renewals = sem.late = 0
        secs, cpu, pcpu, stats = measure(r, WINDOW, sem.run)
        renewals, late = sem.renewals, sem.late
    finally:
        sem.close()
    rate = cpu / secs - base
    per_node = rate / n
    kind = "zadd" if node_only is True else node_only
    what = (("floor (" if kind == "zadd" else "round trip (") + ROUND_TRIPS[kind][0] + ")" if kind
            else f"semaphore ({len(pools)} leases per node)")
    wanted = n if node_only else n * len(pools)
    print(f"{what}: {renewals / secs:.0f} round trips/s of {wanted} wanted ({late} sent > 100 ms late); "
          f"Redis {cpu / secs * 1e6:.0f} us/s (/proc {pcpu / secs * 1e6:.0f}), {rate * 1e6:.0f} us/s above "
          f"idle: {per_node * 1e6:.1f} us/s per node, {rate / max(renewals / secs, 1) * 1e6:.2f} us per round "
          f"trip; load average {load()}", flush=True)
    print(f"  commands per node per second: {stats_line(stats, secs, n, OWN_INFO)}")
    for key in ["{sem:nodes}"] + [f"{{sem:{pool}}}" for pool in pools]:
        r.call("DEL", key)
    return per_node


def print_dead(brokers):
    """The end of each dead brokerd's log, on standard error (a run that failed)."""
    for b in brokers:
        if not b.alive():
            print(f"--- {b.name} exited {b.proc.returncode}:\n{b.log()[-2000:]}", file=sys.stderr)


def stop_brokers(brokers):
    for b in brokers:
        if b.alive():
            b.proc.send_signal(signal.SIGTERM)
    for b in brokers:
        b.stop(timeout=20)
        b.cleanup()


def run_config(brokerd, n, p):
    print(f"\n== {n} brokerds x {p} shared pools (load average {load()}) ==", flush=True)
    tmp = tempfile.mkdtemp(prefix="bench-fleet-")
    r = redisd.RedisServer(tmp, port=0, unix=False).start()
    brokers = []
    pools = [f"fleet{j:02d}" for j in range(p)]
    try:
        print(f"redis-server pid {r.pid} on 127.0.0.1:{r.port} ({r.info('server')['redis_version']})")
        time.sleep(1)
        # 1. Baseline.
        secs, base_cpu, base_proc, _ = measure(r, BASELINE)
        base = base_cpu / secs
        print(f"idle Redis, no client: {base * 1e6:.0f} us/s over {secs:.1f} s (/proc: "
              f"{base_proc / secs * 1e6:.0f} us/s)", flush=True)

        # 2. The plain lease semaphore, n x p idle holders; then the floor: one command per node per second.
        sem_node = reference(r, n, pools, base, node_only=False)
        floor_node = reference(r, n, pools, base, node_only=True)
        if TRIPS:
            for kind in ("info", "zadd+info", "xread"):
                trip = reference(r, n, pools, base, node_only=kind)
                print(f"  {ROUND_TRIPS[kind][0]}: ratio to the floor {trip / floor_node:.2f}", flush=True)

        # 3. The fleet.
        backend = r.url(tcp=True)
        t0 = time.monotonic()
        for i in range(n):
            b = Broker(config(f"fleet-{i:03d}", pools, backend), name=f"bench-fleet-{i:03d}", debug=False)
            brokers.append(b)
            b.start(wait=False)
        for b in brokers:
            b.wait_ready(timeout=120)
        t_ready = time.monotonic() - t0

        def registered():
            return min(r.call("ZCARD", f"{{sb:{pool}}}:nodes") for pool in pools)
        wait_for(lambda: registered() >= n, timeout=180, interval=0.5,
                 message=f"all {n} brokerds registered in all {p} pools")
        t_reg = time.monotonic() - t0
        print(f"{n} brokerds answering after {t_ready:.1f} s, registered in every pool after {t_reg:.1f} s; "
              f"load average {load()}", flush=True)
        # A pool's first use opens a recovery window of one backend-node-ttl, in which the nodes call Redis
        # more often (5 brokerds x 2 pools: 12 EVALSHA/s, then 10): the window starts after it.
        time.sleep(max(0.0, t0 + NODE_TTL + SETTLE - time.monotonic()))
        # A brokerd that holds nothing closes its stream link at its second idle renewal (15 s apart): the
        # window starts once every one has, one connection each (or after 45 s more: a build from before
        # keeps two for good).
        t_links = time.monotonic()
        deadline = t_links + 45
        while int(r.info("clients")["connected_clients"]) > n + 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        print(f"  {int(r.info('clients')['connected_clients']) - 1} brokerd connections "
              f"{time.monotonic() - t_links:.1f} s after the recovery window", flush=True)

        parts, fleet_cpu, fleet_secs = [], 0.0, 0.0
        pids = [b.pid for b in brokers]
        b_cpu0 = sum(proc_cpu(pid) for pid in pids)
        all_stats = {}
        for k in range(PARTS):
            secs, cpu, pcpu, stats = measure(r, WINDOW / PARTS)
            fleet_cpu += cpu
            fleet_secs += secs
            for cmd, (calls, usec) in stats.items():
                c0, u0 = all_stats.get(cmd, (0, 0))
                all_stats[cmd] = (c0 + calls, u0 + usec)
            per = (cpu / secs - base) / n
            parts.append(per)
            print(f"  part {k + 1}: Redis {cpu / secs * 1e6:.0f} us/s (/proc {pcpu / secs * 1e6:.0f}): "
                  f"{per * 1e6:.1f} us/s per brokerd; load average {load()}", flush=True)
        b_cpu = sum(proc_cpu(pid) for pid in pids) - b_cpu0
        dead = [b.name for b in brokers if not b.alive()]
        if dead:
            raise AssertionError(f"brokerds died: {dead}")
        if registered() < n:
            raise AssertionError(f"a brokerd left a pool: {registered()} of {n} registered")
        rss = [proc_rss_kib(pid) for pid in pids]
        fds = [len(os.listdir(f"/proc/{pid}/fd")) for pid in pids]
        clients = r.info("clients")["connected_clients"]
        fleet_rate = fleet_cpu / fleet_secs - base
        node = fleet_rate / n
        print(f"  commands per brokerd per second: {stats_line(all_stats, fleet_secs, n, OWN_INFO * PARTS)}")
        print(f"  brokerds: {b_cpu / fleet_secs / n * 1e6:.0f} us/s of their own CPU each; RSS "
              f"{sum(rss) / n / 1024:.1f} MiB each ({sum(rss) / 1024:.0f} MiB in all); {sum(fds) / n:.0f} fds "
              f"each; Redis has {clients} clients, RSS {proc_rss_kib(r.pid) / 1024:.1f} MiB")
        print(f"fleet {n}x{p}: Redis CPU per brokerd per second {node * 1e6:.1f} us "
              f"(parts {', '.join(f'{x * 1e6:.1f}' for x in parts)}; {node / p * 1e6:.1f} us per pool); "
              f"plain semaphore {sem_node * 1e6:.1f} us per node ({p} leases): ratio {node / sem_node:.2f}; one "
              f"ZADD per node {floor_node * 1e6:.1f} us: ratio {node / floor_node:.1f}; "
              f"goal <= 20 us: {'met' if node * 1e6 <= 20 else 'MISSED'}; one Redis core at "
              f"{node * 10000 * 100:.0f} % for 10,000 brokerds; load average {load()}", flush=True)
        return True
    except BaseException:
        print_dead(brokers)
        raise
    finally:
        stop_brokers(brokers)
        r.close()
        shutil.rmtree(tmp, ignore_errors=True)


def cannot_run():
    """Why a fleet cannot be run here (no redis-server, no shared pools in $BROKERD), or None."""
    if redisd.REDIS_SERVER is None:
        return "redis-server is not installed"
    import faults
    built, why = faults.shared_pools_built()
    return None if built else why


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    brokerd = os.path.abspath(sys.argv[1])
    os.environ["BROKERD"] = brokerd
    configs = sys.argv[2:] or ["100x10", "20x20"]
    why = cannot_run()
    if why:
        print(f"SKIP: {why}")
        return 77
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"bench-fleet: {brokerd}; window {WINDOW:g} s in {PARTS} parts, baseline {BASELINE:g} s, "
          f"settle {SETTLE:g} s; {os.cpu_count()} CPUs")
    for c in configs:
        n, p = (int(x) for x in c.lower().split("x"))
        run_config(brokerd, n, p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
