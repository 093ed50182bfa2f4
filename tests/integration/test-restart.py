#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""brokerd killed and started again (SPEC §3.4): leases survive, nothing is granted twice.

- A pool of 8 with 8 leases held — by `slotctl run` commands, by plain connections, one detached — and 8
  waiters; SIGKILL brokerd and start it on the same state directory and socket: every lease comes back
  with its id, slots and token; the commands' leases stay held (commandPid), the detached one keeps its
  expiry, the connections' ones wait for a reclaim (Acquire with reclaim) and end after reclaim-grace;
  nothing is granted a slot a restored lease holds; the waiters re-queue and get the slots as the
  restored leases end, with fencing tokens above every token issued before the crash.
- slotctl reconnects and reclaims by itself: a later max-hold or Release still reaches it (exit 124);
  it gives up with a warning, and lets the command run, when the broker forgot the lease or stays away.
- The invariant checker of test-brokerd-stress.py (harness.Tracker, harness.monitor) across three
  crashes under load, with slotctl commands among the clients: holders ≤ limit at every sample, no slot
  held twice, fencing tokens increasing across all grants seen, no lease of a running command lost.
- A read-only state directory (a read-only bind mount in a private mount namespace): brokerd reads it and
  grants nothing (Unavailable, reason storage), and says so once; with lease-persistence = best-effort it
  grants in memory, with tokens above the realtime floor. A corrupt history.db: moved aside, a fresh one, grants.

Usage: test-restart.py BROKERD SLOTCTL [unittest arguments]
"""
import glob
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.dont_write_bytecode = True
import harness  # noqa: E402
from harness import (ConnectionClosed, children_of, MountNamespaceBroker, Restarts, Tracker, Varlink,  # noqa: E402
                     VarlinkError, pid_alive, reap, wait_for)

SLOTCTL = None

LIMIT = 8
RECLAIM_GRACE = 3.0
CONFIG = f"""\
[broker]
reclaim-grace = {RECLAIM_GRACE:g}s

[pool p]
limit = {LIMIT}
queue-timeout = 10m

[lane w]
pools = p
policy = wait

[lane ff]
pools = p
policy = fail-fast

[lane short]
pools = p
policy = wait
max-hold = 3s
"""


# ---- helpers ----

def holders_by_id(status):
    return {h["lease"]["id"]: h for h in status["holders"]}


def started(pid):
    """True once slotctl's child has exec'd its command: slotctl had the grant (the lease is in Status a
    moment before slotctl hears of it, while brokerd writes the lease row)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0")[0].decode()
    except FileNotFoundError:
        return False
    return os.path.basename(argv0) != os.path.basename(SLOTCTL)


def command_holders(b, n):
    """Waits until n leases are held by commands that have started; returns {commandPid: holder}."""
    def held():
        hs = [h for h in b.status()["holders"] if "commandPid" in h["lease"] and started(h["lease"]["commandPid"])]
        return hs if len(hs) >= n else None
    return {h["lease"]["commandPid"]: h for h in wait_for(held, 10, message=f"{n} command leases")}


def reclaim_log_lines(b):
    """{lease id: pid} of the reclaims brokerd logged (debug log of the harness)."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"Lease ([0-9a-f]{32}) reclaimed by pid (\d+)", b.log())}


class Restart(harness.BrokerTestCase):

    def start_monitor(self, b, tracker, restarts, stats, on_sample=None):
        """harness.monitor on pool p (tracker.limit slots) until the test ends; returns a function ending it."""
        stop = threading.Event()
        mon = threading.Thread(target=harness.monitor, args=(b.socket_path, "p", tracker.limit, tracker, stop, stats),
                               kwargs={"interval": 0.005, "restarts": restarts, "on_sample": on_sample},
                               daemon=True)
        mon.start()

        def end():
            stop.set()
            mon.join(15)
        self.addCleanup(end)
        return end

    def slotctl(self, b, lane, argv, *options):
        run = harness.SlotctlRun(SLOTCTL, b.socket_path, lane, argv, *options)
        self.addCleanup(run.kill)
        return run

    # -- SPEC §3.4: SIGKILL with 8 leases held and 8 requests waiting --

    def test_crash_with_eight_held_and_eight_waiting(self):
        b = self.broker(CONFIG, "restart-8x8")
        tracker, restarts, stats = Tracker(LIMIT), Restarts(), {"samples": 0}
        end_monitor = self.start_monitor(b, tracker, restarts, stats)

        # 3 leases held by commands that slotctl runs, 4 by plain connections, 1 detached: the pool is full.
        runs = [self.slotctl(b, "w", ["sleep", "60"], "--job", f"cmd{i}") for i in range(3)]
        by_pid = command_holders(b, 3)
        run_of = {}  # lease id -> harness.SlotctlRun
        for run in runs:
            [cmd] = children_of(run.pid)
            run_of[by_pid[cmd]["lease"]["id"]] = run
        conns = []
        for i in range(4):
            a = b.acquire("w", job=f"conn{i}")
            a.until_granted()
            conns.append(a)
        det = b.call("io.slotbroker.Acquire", {"lane": "w", "detach": True, "maxHoldMs": 120000, "job": "det"})["lease"]
        before = holders_by_id(b.status())
        self.assertEqual(len(before), LIMIT, before)
        self.assertEqual(b.pool("p")["inUse"], LIMIT)
        waiters = [b.acquire("w", job=f"wait{i}") for i in range(8)]
        for i, w in enumerate(waiters):
            w.until(lambda a: a.queued and a.params["position"] == i + 1 and a.params["queued"] >= i + 1,
                    what=f"waiter {i} at position {i + 1}")
        max_token = max(h["lease"]["token"] for h in before.values())

        restarts.begin()
        b.crash()
        for a in conns + waiters:  # every connection to the old broker broke
            a.conn.wait_eof(timeout=5)
            a.close()
        starting = time.monotonic()  # the reclaim grace starts after this, when brokerd restores the leases
        b.start()
        restarts.end()

        # Every lease is back, the same one: id, slots, token; held by its command, detached with its
        # expiry, or restored and waiting for its connection to come back.
        after = holders_by_id(b.status())
        self.assertEqual(set(after), set(before), "the leases after the crash are not those before it")
        for lid, h in before.items():
            x, lease = after[lid], h["lease"]
            for key in ("slots", "token", "pool", "lane", "job", "uid", "pid", "grantedAt", "detached"):
                self.assertEqual(x["lease"].get(key), lease.get(key), f"{key} of lease {lid} changed: {x} vs {h}")
            if "commandPid" in lease:
                self.assertEqual(x["lease"].get("commandPid"), lease["commandPid"])
                self.assertEqual(x["state"], "held", x)
            elif lease["detached"]:
                self.assertEqual(lid, det["id"])
                self.assertEqual(x["state"], "held", x)
                self.assertLess(abs(x["lease"]["expiresAt"] - det["expiresAt"]), 5000,
                                f"the detached lease's expiry moved: {x['lease']['expiresAt']} vs {det['expiresAt']}")
            else:
                self.assertEqual(x["state"], "restored", x)
        self.assertEqual(b.pool("p")["inUse"], LIMIT)

        # Nothing is granted a slot that a restored lease holds.
        with self.assertRaises(VarlinkError) as e:
            b.call("io.slotbroker.Acquire", {"lane": "ff", "job": "new"})
        self.assertEqual(e.exception.error, "io.slotbroker.Busy")

        # The waiters, whose connections broke, queue again, in their old order.
        again = []
        for i in range(8):
            a = b.acquire("w", job=f"wait{i}")
            self.assertTrue(a.queued, a.msg)
            self.assertEqual(a.params["position"], i + 1)
            again.append(a)

        # One connection comes back for its lease in time; a reclaim of someone else's lane or of a lease
        # held already is refused.
        c0 = conns[0].lease
        r = b.acquire("w", reclaim=c0["id"])
        got = r.until_granted()
        for key in ("id", "token", "slots"):
            self.assertEqual(got[key], c0[key])
        self.assertTrue(r.continues, "a reclaimed lease's Acquire stays open as its life line")
        self.assertEqual(holders_by_id(b.status())[c0["id"]]["state"], "held")
        for params in ({"lane": "w", "reclaim": c0["id"]}, {"lane": "ff", "reclaim": conns[1].lease["id"]},
                       {"lane": "w", "reclaim": "0" * 32}):
            with self.assertRaises(VarlinkError) as e:
                b.call("io.slotbroker.Acquire", params)
            self.assertEqual(e.exception.error, "io.slotbroker.NoSuchLease", params)

        # slotctl reconnected and reclaimed its commands' leases by itself.
        want = {lid: run.pid for lid, run in run_of.items()}
        wait_for(lambda: all(reclaim_log_lines(b).get(lid) == pid for lid, pid in want.items()), 10,
                 message=f"slotctl to reclaim {want}")

        # The three leases nobody reclaimed end after the reclaim grace, not before; the first three
        # waiters get their slots, with tokens above every token of the old broker.
        lost = {c.lease["id"] for c in conns[1:]}
        time.sleep(max(0.0, starting + RECLAIM_GRACE - 0.5 - time.monotonic()))
        held = set(holders_by_id(b.status()))
        if time.monotonic() < starting + RECLAIM_GRACE:  # else the answer came too late to tell (a slow machine)
            self.assertLessEqual(lost, held, "restored leases ended before the reclaim grace")
        freed = {s for c in conns[1:] for s in c.lease["slots"]}
        new = []
        for a in again[:3]:
            new.append(a.until_granted(timeout=RECLAIM_GRACE + 5))
        self.assertFalse(lost & set(holders_by_id(b.status())))
        self.assertEqual({s for lease in new for s in lease["slots"]}, freed)
        for a in again[3:]:
            self.assertTrue(a.queued, f"granted while no slot was free: {a.msg}")

        # The detached lease, the reclaimed one, then the commands' leases end: one waiter each.
        b.call("io.slotbroker.Release", {"lease": det["id"]})
        new.append(again[3].until_granted())
        self.assertEqual(new[-1]["slots"], det["slots"])
        r.close()
        new.append(again[4].until_granted())
        self.assertEqual(new[-1]["slots"], c0["slots"])
        (first, run), *rest = run_of.items()
        b.call("io.slotbroker.Release", {"lease": first})  # its command runs: revoked, told to slotctl
        self.assertEqual(run.wait(10), 124, run.stderr())
        new.append(again[5].until_granted())
        for i, (lid, run) in enumerate(rest):
            os.killpg(before[lid]["lease"]["commandPid"], signal.SIGTERM)
            self.assertEqual(run.wait(10), 128 + signal.SIGTERM, run.stderr())
            new.append(again[6 + i].until_granted())
        tokens = [lease["token"] for lease in new]
        self.assertEqual(len(set(tokens)), len(tokens))
        self.assertGreater(min(tokens), max_token, "a fencing token went back after the restart")
        for a in again:
            a.close()
        b.wait_idle(timeout=5)
        end_monitor()
        self.assertGreater(stats["samples"], 20)
        self.assertEqual(tracker.failures, [], "invariant violations:\n" + "\n".join(tracker.failures))

    # -- slotctl reclaims by itself --

    def test_slotctl_reclaims_and_still_hears_max_hold(self):
        b = self.broker(CONFIG, "restart-slotctl")
        run = self.slotctl(b, "short", ["sleep", "20"], "--kill-after", "5s")
        [h] = command_holders(b, 1).values()
        lease = h["lease"]
        b.crash()
        time.sleep(0.7)  # slotctl's first attempts find nobody listening: it tries again
        b.start()
        wait_for(lambda: reclaim_log_lines(b).get(lease["id"]) == run.pid, 10,
                 message="slotctl to reclaim its lease")
        x = holders_by_id(b.status())[lease["id"]]
        self.assertEqual(x["state"], "held")
        self.assertEqual(x["lease"]["commandPid"], lease["commandPid"])
        self.assertEqual(x["lease"]["token"], lease["token"])
        # max-hold (3s from the grant, before the crash) still revokes, and slotctl hears it on the
        # connection it reclaimed: it stops the command and exits 124.
        rc = run.wait(10)
        held = (time.time() * 1e6 - lease["grantedAt"]) / 1e6
        self.assertEqual(rc, 124, run.stderr())
        self.assertGreaterEqual(held, 2.9)
        err = run.stderr()
        self.assertEqual(err.count("lost the connection to the broker"), 1, err)
        self.assertIn(f"lease {lease['id']} reclaimed", err)
        b.wait_idle(timeout=5)

    def test_slotctl_keeps_the_command_when_the_lease_is_unknown(self):
        b = self.broker(CONFIG, "restart-forgot")
        # The command runs until the test has seen slotctl hear the answer: a fixed run time raced a slow start
        # (ASan on a loaded machine: the command ended before slotctl asked the broker back).
        done = os.path.join(b.state_dir, "..", "forgot-done")
        run = self.slotctl(b, "w", ["sh", "-c", f'while [ ! -e "{done}" ]; do sleep 0.05; done; exit 7'])
        command_holders(b, 1)
        b.crash()
        for f in glob.glob(os.path.join(b.state_dir, "history.db*")) + glob.glob(os.path.join(b.state_dir, "leases.log*")):
            os.unlink(f)  # a broker that never heard of the lease
        b.start()
        wait_for(lambda: "no longer knows lease" in run.stderr() or run.proc.poll() is not None, 20,
                 message="slotctl to hear that the broker no longer knows its lease")
        self.assertIn("no longer knows lease", run.stderr())
        open(done, "w").close()
        self.assertEqual(run.wait(10), 7, run.stderr())

    def test_slotctl_gives_up_when_the_broker_stays_away(self):
        b = self.broker(CONFIG, "restart-away", clean_exit=False)
        run = self.slotctl(b, "w", ["sh", "-c", "sleep 1.5; exit 3"], "--reclaim-for", "500ms")
        command_holders(b, 1)
        b.crash()
        self.assertEqual(run.wait(10), 3, run.stderr())
        self.assertIn("could not reclaim", run.stderr())

    # -- the invariant across three crashes under load --

    def test_invariant_across_three_crashes(self):
        limit, seconds, n_clients, n_commands = 4, 14.0, 20, 3
        # A longer grace than above: a client thread starved on a busy machine still reclaims in time.
        grace = 6.0
        config = CONFIG.replace(f"limit = {LIMIT}", f"limit = {limit}").replace(
            f"reclaim-grace = {RECLAIM_GRACE:g}s", f"reclaim-grace = {grace:g}s")
        b = self.broker(config, "restart-load")
        seed = int(os.environ.get("SLOTBROKER_STRESS_SEED", str(random.randrange(1 << 30))))
        print(f"\nrestart load: {n_clients} clients, {n_commands} slotctl loops, {seconds} s, seed {seed}",
              file=sys.stderr)
        master = random.Random(seed)
        tracker, restarts, stats = Tracker(limit), Restarts(), {"samples": 0}
        grants = {}        # lease id -> (token, grantedAt), as clients and Status samples saw them
        first_seen = {}    # lease id -> who saw it first (a client's name, or "Status"), for the failure message
        commands = {}      # lease id -> (command pid, when the test learnt of it)
        holding = set()    # the leases clients hold now: each crash waits for one, which must be reclaimed
        lock = threading.Lock()
        workdir = tempfile.mkdtemp(prefix="restart-load-")
        self.addCleanup(shutil.rmtree, workdir, True)

        def saw(lease, source):
            with lock:
                old = grants.setdefault(lease["id"], (lease["token"], lease["grantedAt"]))
                first_seen.setdefault(lease["id"], source)
            if old != (lease["token"], lease["grantedAt"]):
                tracker.fail(f"lease {lease['id']} changed its token or grant time: {old} then {lease} ({source})")

        def on_sample(status, asked):
            ids = set()
            for h in status["holders"]:
                ids.add(h["lease"]["id"])
                saw(h["lease"], "Status")
                if h["state"] == "restored":
                    tracker.count("restored seen")
            out = []
            with lock:
                known = [(lid, pid) for lid, (pid, at) in commands.items() if at < asked]
            for lid, pid in known:
                # Alive now, after the sample: alive during it, and its lease must have been there.
                if lid not in ids and pid_alive(pid):
                    out.append(f"lease {lid} of running command {pid} missing from Status")
            return out

        end_monitor = self.start_monitor(b, tracker, restarts, stats, on_sample)
        deadline = time.monotonic() + seconds

        def client(rng, name):
            n = 0
            while time.monotonic() < deadline:
                n += 1
                try:
                    conn = Varlink(b.socket_path, 10)
                except OSError:
                    time.sleep(0.02)  # brokerd is being restarted
                    continue
                lease = None
                try:
                    conn.send("io.slotbroker.Acquire", {"lane": rng.choice(("w", "w", "ff")), "job": f"{name}-{n}"},
                              more=True)
                    while lease is None:
                        msg = conn.recv(20)  # a wait in the queue: longer than any reclaim grace
                        if "error" in msg:
                            tracker.count(msg["error"].rsplit(".", 1)[-1])
                            if msg["error"] != "io.slotbroker.Busy":
                                tracker.fail(f"{name}: unexpected {msg}")
                            break
                        p = msg["parameters"]
                        if p["state"] == "granted":
                            lease = p["lease"]
                            tracker.granted(lease)
                            saw(lease, name)
                except (ConnectionClosed, OSError):
                    tracker.count("re-queued")  # the broker died under the request: ask again
                except TimeoutError as e:
                    tracker.fail(f"{name}: {e}")
                if lease is None:
                    conn.close()
                    continue
                with lock:
                    holding.add(lease["id"])
                conn = hold(conn, lease, time.monotonic() + rng.uniform(0, 0.3), name)
                with lock:
                    holding.discard(lease["id"])
                tracker.ending(lease)
                if conn:
                    conn.close()

        def hold(conn, lease, until, name):
            """Holds the lease until `until`; after a crash, reconnects and reclaims it."""
            while True:
                try:
                    msg = conn.recv(max(0.0, until - time.monotonic()))
                    tracker.fail(f"{name}: unexpected message while holding {lease['id']}: {msg}")
                    return conn
                except TimeoutError:
                    return conn
                except (ConnectionClosed, OSError):
                    conn.close()
                conn = reclaim(lease, name)
                if conn is None:
                    return None

        def reclaim(lease, name):
            give_up = time.monotonic() + grace
            while time.monotonic() < give_up:
                try:
                    conn = Varlink(b.socket_path, 10)
                except OSError:
                    time.sleep(0.02)
                    continue
                try:
                    conn.send("io.slotbroker.Acquire", {"lane": lease["lane"], "reclaim": lease["id"]}, more=True)
                    msg = conn.recv(10)
                except (ConnectionClosed, OSError, TimeoutError):
                    conn.close()
                    continue
                if "error" in msg:
                    tracker.fail(f"{name}: lease {lease['id']} lost across a restart: {msg}")
                    conn.close()
                    return None
                got = msg["parameters"].get("lease") or {}
                if (got.get("id"), got.get("token"), got.get("slots")) != (lease["id"], lease["token"], lease["slots"]):
                    tracker.fail(f"{name}: reclaimed {got}, not {lease}")
                tracker.count("reclaimed")
                return conn
            tracker.fail(f"{name}: could not reclaim {lease['id']} within the grace")
            return None

        def command_loop(rng, name):
            n = 0
            while time.monotonic() < deadline:
                n += 1
                f = os.path.join(workdir, f"{name}-{n}")
                script = (f'echo "$$ $SLOT_LEASE" >{f}.tmp && mv {f}.tmp {f} && '
                          f'exec sleep {rng.uniform(0.3, 1.5):.2f}')
                p = subprocess.Popen([SLOTCTL, "run", "--socket", b.socket_path, "--lane", "w", "--job", f"{name}-{n}",
                                      "--quiet", "--", "sh", "-c", script], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                lid = None
                while p.poll() is None and not os.path.exists(f):
                    time.sleep(0.01)
                if os.path.exists(f):
                    with open(f) as fh:
                        pid, lid = fh.read().split()
                    with lock:
                        commands[lid] = (int(pid), time.monotonic())
                try:
                    _, err = p.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    _, err = p.communicate()
                    tracker.fail(f"{name}: slotctl did not end")
                if lid:
                    with lock:
                        commands.pop(lid, None)
                if p.returncode == 0:
                    tracker.count("commands run")
                    if "reclaimed" in err:
                        tracker.count("slotctl reclaimed")
                elif p.returncode == 69 and lid is None:
                    # A crash before the grant and no broker back within --reclaim-for (SPEC §6); a waiter
                    # queues again otherwise (test-requeue.py).
                    tracker.count("slotctl lost while waiting")
                else:
                    tracker.fail(f"{name}: slotctl exited {p.returncode}: {err.strip()}")
                reap()

        threads = [threading.Thread(target=client, args=(random.Random(master.getrandbits(64)), f"c{i}"), daemon=True)
                   for i in range(n_clients)]
        threads += [threading.Thread(target=command_loop, args=(random.Random(master.getrandbits(64)), f"cmd{i}"),
                                     daemon=True) for i in range(n_commands)]
        for t in threads:
            t.start()
        crashes = []
        for k in range(3):
            time.sleep(max(0.0, deadline - seconds + (k + 1) * seconds / 4 - time.monotonic()))
            # A crash under a held lease, so that the run has a reclaim to check (a busy machine grants
            # seldom: at a crash chosen by the clock alone, nobody may hold one).
            wait_for(lambda: holding, timeout=20, interval=0.005, message="a client holding a lease")
            restarts.begin()
            b.crash()
            crashes.append(time.time() * 1e6)
            b.start()
            crashes.append(time.time() * 1e6)
            restarts.end()
        for t in threads:
            t.join(seconds + 40)
        hung = [t.name for t in threads if t.is_alive()]
        b.wait_idle(timeout=grace + 5)
        end_monitor()
        print(f"restart load: {dict(sorted(tracker.counts.items()))}, samples {stats['samples']}, "
              f"max in use {stats.get('max_in_use')}", file=sys.stderr)

        self.assertTrue(b.alive())
        self.assertEqual(hung, [], "clients still running")
        self.assertEqual(tracker.failures, [], "invariant violations:\n" + "\n".join(tracker.failures))
        # Fencing tokens only grow, across the restarts too: in the order of the grants, each is larger.
        # A Status sample counts: a lease it lists is written to the lease log, so a restart never hands its
        # token out again (a Status answered before the row was written once showed one that came back later).
        order = sorted((g, t, lid) for lid, (t, g) in grants.items())
        for (g1, t1, l1), (g2, t2, l2) in zip(order, order[1:]):
            self.assertLess(t1, t2, f"token {t1} granted at {g1} (lease {l1}, seen first by {first_seen[l1]}), "
                                    f"then token {t2} at {g2} (lease {l2}, seen first by {first_seen[l2]})")
        # Grants before and after each crash: the load ran through all of them.
        for k in range(3):
            self.assertTrue(any(g < crashes[2 * k] for _, g in grants.values()), f"no grant before crash {k + 1}")
            self.assertTrue(any(g > crashes[2 * k + 1] for _, g in grants.values()), f"no grant after crash {k + 1}")
        for what in ("granted", "Busy", "re-queued", "reclaimed", "commands run"):
            self.assertGreater(tracker.counts.get(what, 0), 0, f"no {what} in the run: {tracker.counts}")
        self.assertGreater(stats["samples"], 100)
        self.assertEqual(stats["max_in_use"], limit)

    # -- the state directory --

    def read_only_broker(self, config, name):
        """brokerd on a copy of a state directory that a first brokerd wrote (one lease held by a command that
        still runs), read-only for the second: a read-only bind mount in a mount namespace of its own."""
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True)
        if probe.returncode != 0:
            self.skipTest(f"no private mount namespace here (unshare -m: {probe.stderr.decode().strip()}): "
                          "the read-only state directory is not tested")
        b = self.broker(config, name)
        b.acquire("w", job="before").close()  # history.db exists, with a row
        b.stop()

        # brokerd's state directory is a read-only bind mount of itself, in a mount namespace of its own.
        ro = MountNamespaceBroker(config, 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1"', name=name + "2")
        shutil.copytree(b.state_dir, ro.state_dir)
        ro.start()
        self.addCleanup(self.stop_broker, ro, True)
        with open(f"/proc/{ro.pid}/mountinfo") as f:
            self.assertTrue(any(f" {ro.state_dir} " in line and " ro," in line for line in f),
                            "the state directory is not read-only for brokerd")
        return ro

    def test_read_only_state_directory_refuses(self):
        """SPEC §3.4: a lease is never granted unless it is persisted. The database is read (its tokens and
        leases restored), nothing is granted (Unavailable, reason storage), Status is served, and the
        episode is logged once, also across the retries (every 5 s)."""
        config = CONFIG + "\n[lane one]\npools = p\npolicy = fail-fast\nmax-in-use = 1\n"
        ro = self.read_only_broker(config, "restart-ro")
        for _ in range(3):
            with self.assertRaises(VarlinkError) as e:
                ro.call("io.slotbroker.Acquire", {"lane": "one"})
            self.assertEqual(e.exception.error, "io.slotbroker.Unavailable")
            self.assertEqual(e.exception.parameters["reason"], "storage")
        self.assertEqual(ro.pool("p")["inUse"], 0)
        time.sleep(5.5)  # a retry of the database in between: the episode is still the same
        with self.assertRaises(VarlinkError):
            ro.call("io.slotbroker.Acquire", {"lane": "one"})
        log = ro.log()
        self.assertEqual(len([x for x in log.splitlines() if "Cannot open history database" in x]), 1, log)
        self.assertEqual(len([x for x in log.splitlines() if "Refusing new leases" in x]), 1, log)
        self.assertTrue(ro.alive())

    def test_read_only_state_directory_best_effort_grants(self):
        """lease-persistence = best-effort: memory-only grants, tokens above the realtime floor."""
        config = CONFIG.replace("[broker]\n", "[broker]\nlease-persistence = best-effort\n")
        config += "\n[lane one]\npools = p\npolicy = fail-fast\nmax-in-use = 1\n"
        ro = self.read_only_broker(config, "restart-ro-be")
        grants = []
        for i in range(3):
            a = ro.acquire("one", job=f"ro{i}")
            grants.append(a.until_granted())
            with self.assertRaises(VarlinkError) as e:
                ro.call("io.slotbroker.Acquire", {"lane": "one"})
            self.assertEqual(e.exception.error, "io.slotbroker.Busy")
            a.close()
            ro.wait_idle()
        tokens = [g["token"] for g in grants]
        self.assertEqual(tokens, sorted(set(tokens)))
        self.assertGreater(tokens[0], (time.time() - 3600) * 1e6, "no realtime floor under best-effort")
        log = ro.log()
        self.assertEqual(len([x for x in log.splitlines() if "not persisted" in x]), 1, log)
        self.assertNotIn("Could not persist", log)

    def test_corrupt_history_is_moved_aside(self):
        b = self.broker(CONFIG, "restart-corrupt")
        b.acquire("w", job="before").close()
        b.stop()
        db = os.path.join(b.state_dir, "history.db")
        for f in glob.glob(db + "-*"):
            os.unlink(f)
        with open(db, "wb") as f:
            f.write(random.Random(7).randbytes(64 * 1024))
        b.start()

        def moved_aside():
            return [m for m in glob.glob(db + ".corrupt-*") if not m.endswith(("-wal", "-shm"))]
        # The history thread opens the database, and moves a corrupt one aside, beside the loop's start.
        wait_for(moved_aside, 10, message="history.db moved aside")
        self.assertEqual(len(moved_aside()), 1, moved_aside())

        def header():
            try:
                with open(db, "rb") as f:
                    return f.read(16)
            except FileNotFoundError:  # moved aside, the fresh one not made yet
                return b""
        # The history writer makes the fresh file on its own thread, after brokerd is listening.
        wait_for(lambda: header() == b"SQLite format 3\0", message="a fresh history.db")
        self.assertIn("moved aside as", b.log())
        a = b.acquire("w", job="after")
        lease = a.until_granted()
        a.close()
        b.wait_idle()

        def recorded():
            try:
                events = b.call("io.slotbroker.History", {"decision": "granted"})["events"]
            except VarlinkError:
                return None
            return [e for e in events if e.get("lease") == lease["id"]]
        wait_for(recorded, 10, message="the grant in the fresh history")

    def test_tokens_do_not_go_back_after_a_corrupt_history(self):
        """SPEC §3.4: fencing tokens are never reused across restarts, also when history.db is lost to
        corruption: the fresh database continues every pool above the realtime clock in µs."""
        b = self.broker(CONFIG, "restart-tokens")
        tokens = []
        for _ in range(3):
            a = b.acquire("w")
            tokens.append(a.until_granted()["token"])
            a.close()
        b.wait_idle()
        b.stop()
        db = os.path.join(b.state_dir, "history.db")
        for f in glob.glob(db + "-*"):
            os.unlink(f)
        with open(db, "wb") as f:
            f.write(random.Random(8).randbytes(64 * 1024))
        b.start()
        a = b.acquire("w")
        self.assertGreater(a.until_granted()["token"], max(tokens), "a fencing token was issued again")
        a.close()


if __name__ == "__main__":
    (_, SLOTCTL), argv = harness.arguments(__doc__, 2)
    harness.main(argv)
