#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Liveness per node (issue 21 item 3; brokerd/lua/README, "Liveness per node"): two brokerds on one
redis-server, three shared pools each.

- an idle node renews for all its pools (sb:live:NODE; once a second at this TTL: TTL/4, no more than a
  third of the self-fence's window) and is not reaped over several TTLs, its lease held; its pools are not
  ticked every second, nor for the other node's deadline (ticks and renewals counted by the commands only
  each of them runs, in INFO commandstats: XREVRANGE a tick, PEXPIRE a renewal);
- a node killed (SIGKILL) while it renews loses its slot at its TTL (+ 2 s), no sooner than a TTL after its
  last renewal less a second: the other node's waiter is granted then; and with nobody waiting there, its
  slot is freed in Redis by the other node's next renewal (every TTL/2 while it holds nothing) that finds it
  dead in sb:lives and has that node tick;
- an idle node's stream read (XREAD) blocks long (no request of its own out or waiting), and a grant to a
  waiter that came meanwhile ends it at once; a pool added by reload to a node holding a lease and waiting for
  nothing joins its read at once (the long read is cut short), not at the read's end;
- a node that holds nothing closes its stream link (one connection instead of two: Redis's upkeep of an idle
  client is part of an idle node's cost), and opens it again for its next request: a waiter's grant, appended
  to its stream while it was closed or after, reaches it as ever;
- the command link's watch (INFO) goes with a busy node's renewal, pipelined: one round trip, not two; a
  node that holds nothing renews every TTL/2, with no INFO, until its next call, which takes the INFO ahead
  of it and the renewals back to the busy pace;
- with $SLOTBROKER_OLD_BROKERD (a build from before the live keys, as test-shared-upgrade takes it): a node
  of that version ticking every second beside an idle node of this one never reaps it (a covered
  registration scores +inf), over several TTLs; skipped without it.

Skipped (77) without redis-server.

Usage: test-shared-liveness.py BROKERD [unittest arguments]
"""
import os
import re
import shutil
import sys
import tempfile
import time
from statistics import median

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
from harness import wait_for  # noqa: E402
from redisd import RedisServer  # noqa: E402

TTL = 6  # seconds: backend-node-ttl, and the first use's recovery window
POOLS = 3


def config(backend, node, pools=POOLS):
    """Pools s0…s2 (or as many as `pools`) of one slot on the backend, lane lN waiting on pool sN."""
    text = f"[broker]\nnode-name = {node}\nrevoke-grace = 1s\n"
    for i in range(pools):
        text += f"\n[pool s{i}]\nlimit = 1\nbackend = {backend}\nbackend-node-ttl = {TTL}s\n"
        text += f"\n[lane l{i}]\npools = s{i}\npolicy = wait\n"
    return text


class Monitor:
    """MONITOR on a connection of its own: what Redis runs, as (time, client address, [words])."""
    LINE = re.compile(r'^(\d+\.\d+) \[\d+ ([^\]]+)\] (.*)$')
    WORD = re.compile(r'"((?:[^"\\]|\\.)*)"')

    def __init__(self, redis):
        self.conn = redis.client(timeout=5.0)
        self.conn.send("MONITOR")
        if self.conn.read() != "OK":
            raise AssertionError("MONITOR refused")

    def close(self):
        self.conn.close()

    def until(self, deadline, stop=None):
        """The commands run until the monotonic deadline, or until one for which stop() holds (included)."""
        out = []
        while time.monotonic() < deadline:
            try:
                line = self.conn.read(timeout=max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                break
            m = self.LINE.match(line)
            if not m:
                continue
            cmd = (float(m.group(1)), m.group(2), self.WORD.findall(m.group(3)))
            out.append(cmd)
            if stop and stop(cmd):
                break
        return out


class TestLiveness(harness.BrokerTestCase):

    def setUp(self):
        faults.skip_unless_shared_pools(self)
        self.tmp = tempfile.mkdtemp(prefix="test-shared-liveness-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.redis = RedisServer(self.tmp).start()
        self.addCleanup(self.redis.close)

    def calls(self):
        """{command: calls} from INFO commandstats."""
        out = {}
        for k, v in self.redis.info("commandstats").items():
            if k.startswith("cmdstat_"):
                out[k[len("cmdstat_"):]] = int(v.split(",")[0].split("=")[1])
        return out

    def renewing(self, n):
        """True once n live keys each name every pool (their nodes' renewals cover them all)."""
        keys = self.redis.call("KEYS", "sb:live:*")
        if len(keys) != n:
            return False
        want = "," + ",".join(f"{{sb:s{i}}}" for i in range(POOLS)) + ","
        return all(self.redis.call("HGET", k, "pools") == want for k in keys)

    def two_nodes_b_holding(self):
        url = self.redis.url()
        a = self.broker(config(url, "node-a"), "liveness-a")
        b = self.broker(config(url, "node-b"), "liveness-b", clean_exit=False)
        held = self.acquire(b, "l0")
        held.until_granted(timeout=TTL + 20)  # the first use waits out one TTL: a bound, not a sleep
        wait_for(lambda: self.renewing(2), timeout=TTL + 20, message="both nodes' renewals to cover their pools")
        return a, b, held

    def test_an_idle_node_renews_and_its_pools_are_not_ticked_every_second(self):
        a, b, held = self.two_nodes_b_holding()
        before = self.calls()
        window = 3 * TTL
        time.sleep(window)  # the time measured: idle nodes, nothing to wait for
        after = self.calls()
        ticks = after.get("xrevrange", 0) - before.get("xrevrange", 0)
        renewals = after.get("pexpire", 0) - before.get("pexpire", 0)
        every_second = 2 * POOLS * window
        print(f"# {window} s, 2 nodes x {POOLS} pools: {ticks} ticks (one a pool a second: {every_second}), "
              f"{renewals} renewals, {after.get('fcall', 0) - before.get('fcall', 0)} FCALLs", flush=True)
        self.assertGreaterEqual(renewals, 2 * window // 2, "renewals: about one a node a second")
        self.assertLess(ticks, every_second // 3, "an idle node's pools ticked about every second")
        # B was not reaped: its lease is still its own, A sees it held.
        self.assertIsNone(held.conn.poll(0.0), "B's lease ended")
        self.assertTrue(held.granted)
        holders = wait_for(lambda: a.status().get("otherHolders"), timeout=10, message="A to list B's holder")
        self.assertEqual([(h["node"], h["pool"]) for h in holders], [("node-b", "s0")])

    def test_idle_pools_are_not_ticked_for_the_other_nodes_deadlines(self):
        # Before: every node ticked every pool each TTL/2..TTL for the other node's covered deadline (22
        # ticks in 18 s here); now an idle pool ticks when it has something to do, or with a renewal
        # SHARED_IDLE_PERIOD (5 min) after its last tick.
        a, b, held = self.two_nodes_b_holding()
        time.sleep(2)  # the registering ticks' answers, and the first renewals, are in
        before = self.calls()
        window = 3 * TTL
        time.sleep(window)  # the time measured: idle nodes, nothing to wait for
        after = self.calls()
        ticks = after.get("xrevrange", 0) - before.get("xrevrange", 0)
        print(f"# {window} s, 2 nodes x {POOLS} pools: {ticks} ticks", flush=True)
        self.assertLessEqual(ticks, POOLS, "idle pools ticked for the other node's deadline")
        self.assertIsNone(held.conn.poll(0.0), "B's lease ended")

    def node_id(self, name):
        """The node id of the brokerd whose node-name is `name` (its pools' node hashes say it)."""
        for key in self.redis.call("KEYS", "{sb:s0}:node:*"):
            if self.redis.call("HGET", key, "name") == name:
                return key.rsplit(":", 1)[1]
        raise AssertionError(f"no node named {name} in s0")

    def test_an_idle_nodes_stream_read_blocks_long_and_a_grant_ends_it(self):
        # Before: each node's read timed out every 5 s (XREAD BLOCK 5000), 3 or 4 a node in 18 s; a node with
        # no request out or waiting now blocks 60 s. B holds a lease and waits for nothing: idle too.
        a, b, held = self.two_nodes_b_holding()
        time.sleep(2)  # B's last read from while it waited ends (5 s at most), into the window or before
        before = self.calls()
        window = 3 * TTL
        time.sleep(window)  # the time measured: idle nodes, nothing to wait for
        after = self.calls()
        reads = after.get("xread", 0) - before.get("xread", 0)
        print(f"# {window} s, 2 idle nodes: {reads} stream reads ended (one every 5 s a node: "
              f"{2 * window // 5})", flush=True)
        self.assertLessEqual(reads, 2, "an idle node's stream read ends every few seconds")
        # A waits now (its stream link, closed while it held nothing, open again): B's release grants A's
        # waiter, whose entry in A's stream ends the read at once (not 60 s later; A's heartbeat asks for its
        # places every second meanwhile too).
        waiter = self.acquire(a, "l0")
        self.assertTrue(waiter.queued or not waiter.granted, waiter.params)
        released = time.monotonic()
        held.close()
        waiter.until_granted(timeout=TTL + 20)
        print(f"# granted {time.monotonic() - released:.2f} s after the release", flush=True)
        self.assertLess(time.monotonic() - released, 3.0)

    def brokerd_links(self):
        """The connections of the brokerds: every client but the one asking."""
        return [c for c in self.redis.call("CLIENT", "LIST").splitlines() if "cmd=client" not in c]

    def test_a_node_that_holds_nothing_closes_its_stream_link_and_opens_it_for_a_request(self):
        # A holds nothing: after its second idle renewal (TTL/2 apart) only its command link is left; B holds
        # a lease and keeps both. Before: four connections for good.
        a, b, held = self.two_nodes_b_holding()
        links = wait_for(lambda: (lambda l: l if len(l) == 3 else None)(self.brokerd_links()), timeout=4 * TTL,
                         message="A's stream link to close (three connections left)")
        self.assertEqual(sum("cmd=xread" in c for c in links), 1, links)  # B's read, blocked
        xreads = self.calls().get("xread", 0)
        time.sleep(TTL)  # the time measured: it stays closed while A is idle
        self.assertEqual(len(self.brokerd_links()), 3, self.brokerd_links())
        # A's request waits behind B's lease: its stream link opens again, reads from where it stopped, and
        # B's release grants A's waiter through it.
        waiter = self.acquire(a, "l0")
        self.assertTrue(waiter.queued or not waiter.granted, waiter.params)
        wait_for(lambda: len(self.brokerd_links()) == 4, timeout=10, message="A's stream link to open again")
        released = time.monotonic()
        held.close()
        waiter.until_granted(timeout=TTL + 20)
        print(f"# granted {time.monotonic() - released:.2f} s after the release; "
              f"{self.calls().get('xread', 0) - xreads} reads since the link closed", flush=True)
        self.assertLess(time.monotonic() - released, 3.0)

    def test_a_pool_added_by_reload_joins_an_idle_nodes_long_read_at_once(self):
        url = self.redis.url()
        a = self.broker(config(url, "node-a"), "liveness-a")
        # A lease held keeps the stream link open (a node holding nothing closes it).
        held = self.acquire(a, "l0")
        held.until_granted(timeout=TTL + 20)  # the first use waits out one TTL: a bound, not a sleep
        wait_for(lambda: self.renewing(1), timeout=TTL + 20, message="A's renewals to cover its pools")
        node = self.node_id("node-a")
        # Its long read is out (no request of its own waits): the pool added must not wait for its end (60 s).
        mon = Monitor(self.redis)
        self.addCleanup(mon.close)
        a.write_config(config(url, "node-a", pools=POOLS + 1))
        a.reload()
        stream = f"{{sb:s{POOLS}}}:s:{node}"
        seen = mon.until(time.monotonic() + 10, lambda c: c[2][:1] == ["XREAD"] and stream in c[2])
        registered = self.redis.call("ZSCORE", f"{{sb:s{POOLS}}}:nodes", node)
        self.assertTrue(seen and stream in seen[-1][2], f"no XREAD of {stream} within 10 s of the reload")
        self.assertIsNotNone(registered)
        first_tick = next((c[0] for c in seen if c[2][:1] in (["FCALL"], ["EVALSHA"]) and
                           f"{{sb:s{POOLS}}}" in c[2]), None)
        self.assertIsNotNone(first_tick, "the new pool's first tick")
        print(f"# the new pool's stream read {seen[-1][0] - first_tick:.2f} s after its first tick", flush=True)
        self.assertLess(seen[-1][0] - first_tick, 3.0)

    def test_the_links_watch_goes_with_a_busy_nodes_renewal_and_rests_while_it_is_idle(self):
        # The command link reads INFO (policy, role, run id) every 5 s: on its own round trip before, then
        # pipelined right before a renewal (FCALL …_renew) on the same connection when one is due. A node that
        # holds nothing renews every TTL/2 instead of TTL/4 (or a third of the fence's window), without INFO:
        # its next call (here an Acquire's submit) takes the INFO ahead of it, and the renewals go back to the
        # busy pace. Over TCP: MONITOR names each connection by its address (a Unix socket's are all one path).
        tmp = tempfile.mkdtemp(prefix="test-shared-liveness-tcp-")
        self.addCleanup(shutil.rmtree, tmp, True)
        self.redis.close()
        self.redis = RedisServer(tmp, port=0, unix=False).start()
        self.addCleanup(self.redis.close)
        a = self.broker(config(self.redis.url(tcp=True), "node-a"), "liveness-a")
        held = self.acquire(a, "l0")
        held.until_granted(timeout=TTL + 20)  # the first use waits out one TTL: a bound, not a sleep
        wait_for(lambda: self.renewing(1), timeout=TTL + 20, message="A's renewals to cover its pools")
        mon = Monitor(self.redis)
        self.addCleanup(mon.close)

        def is_renewal(c):
            return c[2][:1] == ["FCALL"] and c[2][1].endswith("_renew")

        def is_info(c):
            return c[2] == ["INFO", "server", "memory", "replication"]

        def gaps(cmds):
            times = [c[0] for c in cmds if is_renewal(c)]
            return [round(b - a, 2) for a, b in zip(times, times[1:])]

        busy = mon.until(time.monotonic() + 12)
        commands = {c[1] for c in busy if c[2][:1] == ["FCALL"]}
        self.assertEqual(len(commands), 1, "one command link")
        infos = [i for i, c in enumerate(busy) if is_info(c) and c[1] in commands]
        print(f"# busy: {len(infos)} INFOs in 12 s, renewals {gaps(busy)} s apart", flush=True)
        self.assertGreaterEqual(len(infos), 2, "the link's watch: an INFO every 5 s")
        for i in infos:
            t, addr, _ = busy[i]
            following = next((c for c in busy[i + 1:] if c[1] == addr), None)
            self.assertIsNotNone(following, "nothing after the INFO on its connection")
            self.assertTrue(is_renewal(following), following)
            self.assertLess(following[0] - t, 0.005, "the INFO and the renewal were not sent together")
        # TTL 6 s, revoke grace 1 s: a third of the fence's window (6 − 1 − 2 s) is 1 s. The pace by the
        # median; the bound that matters by the longest gap: past the fence's window (3 s) the node would
        # revoke its lease. Single gaps move with the machine (MONITOR stamps when Redis ran each renewal): a
        # loaded CI machine stalled the sanitized brokerd 0.5 s here and 2.8 s in the idle part below.
        busy_gaps = gaps(busy)
        self.assertGreaterEqual(median(busy_gaps), 0.9, "a busy node's renewals")
        self.assertLessEqual(median(busy_gaps), 1.1, "a busy node's renewals")
        self.assertLess(max(busy_gaps), 3.0, "a busy node's renewal came past its fence's window")

        held.close()  # A holds nothing now: its release goes, then its renewals slow down and its watch rests
        idle = mon.until(time.monotonic() + 4 * TTL)
        first_idle = next(i for i, c in enumerate(idle) if is_renewal(c) and
                          any(d[2][:1] == ["FCALL"] and not is_renewal(d) for d in idle[:i]))
        rest = idle[first_idle:]
        infos = [c for c in rest if is_info(c) and c[1] in commands]
        print(f"# idle: {len(infos)} INFOs in {rest[-1][0] - rest[0][0]:.1f} s, renewals {gaps(rest)} s apart",
              flush=True)
        self.assertEqual(infos, [], "an idle node's watch read INFO")
        rest_gaps = gaps(rest)
        self.assertGreaterEqual(len(rest_gaps), 2, "an idle node's renewals")
        # TTL/2: 3 s; none at the busy pace (1 s); no gap as long as the TTL, past which its registration
        # would lapse.
        self.assertGreaterEqual(min(rest_gaps), 2.0, "an idle node's renewal at the busy pace")
        self.assertGreaterEqual(median(rest_gaps), 2.9, "an idle node's renewals")
        self.assertLessEqual(median(rest_gaps), 3.2, "an idle node's renewals")
        self.assertLess(max(rest_gaps), TTL, "an idle node's registration lapsed")

        again = self.acquire(a, "l0")
        again.until_granted(timeout=10)
        woke = mon.until(time.monotonic() + 3)
        call = next(i for i, c in enumerate(woke) if c[1] in commands and c[2][:1] == ["FCALL"] and
                    not is_renewal(c))
        before = [c for c in woke[:call] if c[1] in commands]
        self.assertTrue(before and is_info(before[-1]), f"no INFO ahead of the first call: {woke[:call + 1]}")
        self.assertLess(woke[call][0] - before[-1][0], 0.005, "the INFO and the call were not sent together")
        renewals = [c[0] for c in woke if is_renewal(c)]
        last_idle = max(c[0] for c in rest if is_renewal(c))
        print(f"# busy again: the next renewal {renewals[0] - last_idle:.2f} s after the last idle one, "
              f"{renewals[0] - woke[call][0]:.2f} s after the call", flush=True)
        self.assertLessEqual(renewals[0] - last_idle, max(1.5, woke[call][0] - last_idle + 0.5),
                             "the renewals did not go back to the busy pace")

    def test_a_node_killed_loses_its_slot_at_its_ttl_with_nothing_waiting(self):
        # Nobody waits in s0: A's pools are idle, covered, and tick for nothing of their own; the renewal
        # that finds B past its deadline (sb:lives) has A tick B's pools, whose tick reaps it.
        a, b, held = self.two_nodes_b_holding()
        self.assertEqual(self.redis.call("HGET", "{sb:s0}:meta", "in_use"), "1")
        killed = time.monotonic()
        b.crash()
        held.close()
        wait_for(lambda: self.redis.call("HGET", "{sb:s0}:meta", "in_use") == "0", timeout=TTL + 20,
                 interval=0.05, message="B's slot in s0 to be freed")
        after = time.monotonic() - killed
        print(f"# freed {after:.2f} s after the kill (TTL {TTL} s), nothing waiting", flush=True)
        self.assertGreaterEqual(after, TTL - 1.5)
        # A holds nothing: it renews every TTL/2, and the first renewal past B's deadline claims it.
        self.assertLessEqual(after, TTL + TTL / 2 + 1)

    def test_a_node_of_the_version_before_never_reaps_an_idle_one(self):
        old = os.environ.get("SLOTBROKER_OLD_BROKERD")
        if not old:
            self.skipTest("$SLOTBROKER_OLD_BROKERD is not set (a brokerd from before the live keys)")
        url = self.redis.url()
        a = self.broker(config(url, "node-old"), "liveness-old", brokerd=old)
        b = self.broker(config(url, "node-new"), "liveness-new")
        held = self.acquire(b, "l0")
        held.until_granted(timeout=TTL + 20)
        wait_for(lambda: self.renewing(1), timeout=TTL + 20, message="the new node's renewals to cover its pools")
        time.sleep(3 * TTL)  # the time measured: the old node ticks every second meanwhile
        self.assertIsNone(held.conn.poll(0.0), "the new node's lease ended")
        holders = wait_for(lambda: a.status().get("otherHolders"), timeout=10, message="the old node to list it")
        self.assertEqual([(h["node"], h["pool"]) for h in holders], [("node-new", "s0")])
        self.assertEqual(self.redis.call("ZSCORE", "{sb:s0}:nodes", self.redis.call("KEYS", "sb:live:*")[0][8:]),
                         "inf")

    def test_a_node_killed_loses_its_slot_at_its_ttl(self):
        a, b, held = self.two_nodes_b_holding()
        waiter = self.acquire(a, "l0")
        self.assertTrue(waiter.queued or not waiter.granted, waiter.params)
        killed = time.monotonic()
        b.crash()
        held.close()
        waiter.until_granted(timeout=TTL + 20)
        after = time.monotonic() - killed
        print(f"# granted {after:.2f} s after the kill (TTL {TTL} s)", flush=True)
        # Its last renewal was at most a second before the kill; Redis frees its slot a TTL after it, and the
        # waiting node ticks every second: TTL + 2 s at the latest (with a second's slack for a busy machine).
        self.assertGreaterEqual(after, TTL - 1.5)
        self.assertLessEqual(after, TTL + 3)


if __name__ == "__main__":
    (_,), argv = harness.arguments(__doc__, 1)
    harness.main(argv)
