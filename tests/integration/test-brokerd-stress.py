#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The invariant under load (SPEC §3.4, §10): 64 concurrent clients hammer one pool of 4 slots through
fail-fast and wait lanes, holding, releasing, abandoning and disconnecting at random, while a monitor
samples Status every few milliseconds and the unchanged configuration is reloaded twice a second. At no instant may more slots be in use than the limit, nor two live
leases hold the same slot; no lease id or fencing token is granted twice; every request gets its final
answer (a grant, a refusal, or the client's own close); at the end nothing is held, nobody waits, and
brokerd has closed every connection.

Usage: test-brokerd-stress.py BROKERD [unittest arguments]
Environment: SLOTBROKER_STRESS_SECONDS (default 30), SLOTBROKER_STRESS_CLIENTS (default 64),
SLOTBROKER_STRESS_SEED (default: random, printed).
"""
import os
import random
import sys
import threading
import time
import unittest

sys.dont_write_bytecode = True
import harness  # noqa: E402
from harness import Broker, ConnectionClosed, Tracker, Varlink, VarlinkError, wait_for  # noqa: E402

LIMIT = 4
CONFIG = f"""\
[pool s]
limit = {LIMIT}
queue-timeout = 2s

[lane fast]
pools = s
policy = fail-fast

[lane slow]
pools = s
policy = wait

[lane urgent]
pools = s
policy = wait
priority = 10
queue-timeout = 500ms
"""

ANSWER_TIMEOUT = 10.0  # longer than any budget (2 s): a request not answered by then is lost
# The checks themselves (harness.Tracker: what the clients saw; harness.monitor: Status samples) are shared
# with test-restart.py, which runs the same invariant across crashes of brokerd.


def client(path, tracker, deadline, rng, name):
    """One client's loop: a request at a time, each ended one way or another."""
    admin = None
    n = 0
    while time.monotonic() < deadline:
        n += 1
        lane = rng.choice(("fast", "slow", "slow", "urgent"))
        params = {"lane": lane, "job": f"{name}-{n}"}
        if rng.random() < 0.2:
            params["wait"] = False
        if rng.random() < 0.3:
            params["queueWaitMs"] = rng.randint(20, 800)
        more = rng.random() < 0.85
        end = rng.choice(("close", "close", "release", "abandon"))
        try:
            conn = Varlink(path, ANSWER_TIMEOUT)
        except OSError as e:
            tracker.fail(f"{name}: connect failed: {e}")
            return
        try:
            conn.send("io.slotbroker.Acquire", params, more=more)
            abandon_at = time.monotonic() + rng.uniform(0, 0.3) if end == "abandon" else None
            while True:
                timeout = ANSWER_TIMEOUT if abandon_at is None else max(0.0, abandon_at - time.monotonic())
                try:
                    msg = conn.recv(timeout)
                except TimeoutError:
                    if abandon_at is not None:
                        tracker.count("abandoned")  # our own close ends the request
                        break
                    tracker.fail(f"{name}: request {params} got no final answer within {ANSWER_TIMEOUT} s")
                    break
                if "error" in msg:
                    tracker.count(msg["error"].rsplit(".", 1)[-1])
                    if msg["error"] not in ("io.slotbroker.Busy", "io.slotbroker.QueueTimeout",
                                            "io.slotbroker.QueueShed", "io.slotbroker.QueueFull"):
                        tracker.fail(f"{name}: unexpected error {msg}")
                    break
                p = msg.get("parameters") or {}
                if p.get("state") == "queued":
                    if not msg.get("continues"):
                        tracker.fail(f"{name}: a queued reply without continues: {msg}")
                    if not (1 <= p["position"] <= p["queued"]):
                        tracker.fail(f"{name}: position {p['position']} of {p['queued']}")
                    continue
                if p.get("state") != "granted":
                    tracker.fail(f"{name}: unexpected reply {msg}")
                    break
                lease = p["lease"]
                tracker.granted(lease)
                if bool(msg.get("continues")) != more:
                    tracker.fail(f"{name}: grant continues={msg.get('continues')} for more={more}")
                time.sleep(rng.uniform(0, 0.02))
                tracker.ending(lease)
                if end == "release" and more:
                    if admin is None:
                        admin = Varlink(path, ANSWER_TIMEOUT)
                    admin.call("io.slotbroker.Release", {"lease": lease["id"]})
                    final = conn.recv(ANSWER_TIMEOUT)
                    if (final.get("parameters") or {}).get("state") != "released" or final.get("continues"):
                        tracker.fail(f"{name}: after Release the holder got {final}")
                    tracker.count("released")
                else:
                    tracker.count("closed")
                break
        except (ConnectionClosed, TimeoutError, VarlinkError, OSError) as e:
            tracker.fail(f"{name}: {params}: {type(e).__name__}: {e}")
        finally:
            conn.close()
    if admin:
        admin.close()


def reloader(path, tracker, stop, stats):
    """Reloads the (unchanged) configuration twice a second: a reload must not drop or disturb anything."""
    conn = Varlink(path, ANSWER_TIMEOUT)
    try:
        while not stop.wait(0.5):
            conn.call("io.slotbroker.Reload")
            stats["reloads"] += 1
    except Exception as e:  # noqa: BLE001
        tracker.fail(f"reloader: {type(e).__name__}: {e}")
    finally:
        conn.close()


class Invariant(unittest.TestCase):

    def test_invariant_under_load(self):
        seconds = float(os.environ.get("SLOTBROKER_STRESS_SECONDS", "30"))
        n_clients = int(os.environ.get("SLOTBROKER_STRESS_CLIENTS", "64"))
        seed = int(os.environ.get("SLOTBROKER_STRESS_SEED", str(random.randrange(1 << 30))))
        print(f"\nstress: {n_clients} clients for {seconds} s, seed {seed}", file=sys.stderr)
        b = Broker(CONFIG, name="brokerd-stress", debug=False).start()
        self.addCleanup(b.stop)
        wait_for(lambda: not b.client_connections(), message="no connection before the run")
        baseline = b.fds()

        tracker = Tracker(LIMIT)
        stats = {"samples": 0, "max_in_use": 0, "max_waiting": 0, "reloads": 0}
        stop = threading.Event()
        mon = threading.Thread(target=harness.monitor, args=(b.socket_path, "s", LIMIT, tracker, stop, stats),
                               daemon=True)
        mon.start()
        rel = threading.Thread(target=reloader, args=(b.socket_path, tracker, stop, stats), daemon=True)
        rel.start()
        deadline = time.monotonic() + seconds
        master = random.Random(seed)
        threads = [threading.Thread(target=client, args=(b.socket_path, tracker, deadline,
                                                         random.Random(master.getrandbits(64)), f"c{i}"),
                                    daemon=True) for i in range(n_clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 2 * ANSWER_TIMEOUT + 5)
        hung = [t.name for t in threads if t.is_alive()]
        stop.set()
        mon.join(ANSWER_TIMEOUT)
        rel.join(ANSWER_TIMEOUT)

        print(f"stress: {dict(sorted(tracker.counts.items()))}, {stats}", file=sys.stderr)
        self.assertTrue(b.alive(), f"brokerd died under load (exit status {b.proc.returncode}; a negative status "
                                   f"is the signal); first failures seen by the clients: {tracker.failures[:3]}")
        self.assertEqual(hung, [], "client threads still running: a request never got its final answer")
        self.assertEqual(tracker.failures, [], "invariant violations:\n" + "\n".join(tracker.failures))
        # The load was what it claims to be: grants, refusals of both kinds, releases and abandons.
        for what in ("granted", "Busy", "QueueTimeout", "closed", "released", "abandoned"):
            self.assertGreater(tracker.counts.get(what, 0), 0, f"no {what} in the run: {tracker.counts}")
        self.assertGreater(stats["samples"], 50, "the monitor sampled too rarely")
        self.assertEqual(stats["max_in_use"], LIMIT, "the pool was never full: not a stress")
        self.assertGreater(stats["max_waiting"], 0)
        # Nothing left: no holder, no waiter, no connection, no fd.
        b.wait_idle(timeout=5)
        wait_for(lambda: not b.client_connections(), message="brokerd to close every connection")
        # Files the history writer opens on its first writes (history.db-wal, -shm) and the journal's datagram
        # socket may come after the baseline; anything else new is a leak.
        def leaked():
            return {fd: t for fd, t in b.fds().items()
                    if fd not in baseline and not t.startswith(b.state_dir) and t != "anon_inode:[eventfd]"
                    and not (t.startswith("socket:[") and int(t[8:-1]) not in b.client_connections())}
        try:
            wait_for(lambda: not leaked(), message="no fd left behind")
        except AssertionError:
            self.fail(f"brokerd left fds behind: {leaked()}")


if __name__ == "__main__":
    _, argv = harness.arguments(__doc__, 1)
    harness.main(argv)
