#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Replies that no command asked for, and a server that keeps brokerd calling (SPEC §11: whatever answers
at a backend's address is untrusted).

hiredis 0.14 aborts the process (an assert, in release builds too) on a reply that is no error while no
call waits on a context that is not subscribed, and on a pub/sub message shorter than 3 elements, whose
kind or channel is no string, or an unsubscribe (after which the next message is unasked). With a fake Redis
(fakeredis.py) and fake Sentinels:
- a script call answered twice (the second reply a status, an integer, an array, a nil), and a stream read
  answered twice: brokerd lives, the link ends "Not a Redis server: A reply to no command" (the pool
  refused "not-redis"), and once the server answers once a call, the pool is up again;
- a Sentinel's query answered twice: the same for the Sentinel link;
- a Sentinel's pub/sub link sending a message of 1 element, of an integer kind or channel, an unsubscribe
  (of 3 elements, then a message; of 2), a nil, a status, a message of another channel: brokerd lives, the
  link ends with the reason, subscribes again, and the pool is up again;
- a stream read answered at once with nothing, again and again: brokerd reads at most about once a
  second (a count of XREADs in a window, not a time);
- a script call answered "settling" for ever: brokerd sends it again a bounded number of times, then holds
  it until the next heartbeat (a count of FCALLs in a window), and counts it as bad input.

Usage: test-redis-unasked.py BROKERD [unittest arguments]
"""
import sys
import threading
import time
import unittest

sys.dont_write_bytecode = True
import faults  # noqa: E402
import fakeredis  # noqa: E402
import harness  # noqa: E402
from fakeredis import FakeRedis, array, bulk, integer, status  # noqa: E402
from harness import wait_for  # noqa: E402


def bad_input_total(b):
    for line in b.call("io.slotbroker.Metrics")["text"].splitlines():
        if line.startswith('slotbroker_backend_bad_input_total{pool="shared"}'):
            return int(line.split()[-1])
    return None


def config(backend):
    return f"""\
[pool shared]
limit = 1
backend = {backend}

[lane shared]
pools = shared
"""


SENTINEL_INFO = "# Server\r\nredis_version:7.0.15\r\nredis_mode:sentinel\r\nrun_id:%s\r\n" % ("s" * 40)
CHANNEL = b"+switch-master"

# What a Sentinel sends on its pub/sub link after confirming the subscription, each a crash of hiredis 0.14.
PUBSUB = {
    "short": b"*1\r\n$7\r\nmessage\r\n",
    "integer-kind": b"*3\r\n:1\r\n$14\r\n+switch-master\r\n$1\r\nx\r\n",
    "integer-channel": b"*3\r\n$7\r\nmessage\r\n:5\r\n$1\r\nx\r\n",
    "nil-kind": b"*3\r\n$-1\r\n$14\r\n+switch-master\r\n$1\r\nx\r\n",
    # Its unsubscribe, count 0: hiredis leaves subscribed mode, and the message after it is unasked.
    "unsubscribe": b"*3\r\n$11\r\nunsubscribe\r\n$14\r\n+switch-master\r\n:0\r\n"
                   b"*3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n$1\r\nx\r\n",
    "unsubscribe-short": b"*2\r\n$11\r\nunsubscribe\r\n$14\r\n+switch-master\r\n",
    "punsubscribe": b"*3\r\n$12\r\npunsubscribe\r\n$14\r\n+switch-master\r\n:0\r\n",
    # No array: hiredis would run the callback of the reply before it again.
    "nil": b"*-1\r\n",
    "status": b"+OK\r\n",
    "other-channel": b"*3\r\n$7\r\nmessage\r\n$5\r\nother\r\n$1\r\nx\r\n",
}

# A second reply after a script's answer.
TAILS = {"status": b"+OK\r\n", "integer": b":1\r\n", "array": b"*0\r\n", "nil": b"$-1\r\n"}


class Unasked(harness.BrokerTestCase):
    def setUp(self):
        faults.skip_unless_shared_pools(self)

    def fake(self, behaviour):
        f = FakeRedis(behaviour)
        self.addCleanup(f.close)
        return f

    def redis(self, hostile=None):
        """A Redis for the pool: ticks answered, XREAD blocking 200 ms. hostile(args) -> bytes or None: a
        reply sent instead of the ordinary one."""
        def behaviour(fake, c, args):
            out = fakeredis.setup_ok(fake, c, args)
            if out is not None:
                return out
            if hostile:
                out = hostile(c, args)
                if out is not None:
                    return out
            name, _ = fakeredis.script_of(c, args)
            if name == "tick":
                return fakeredis.tick_ok(fakeredis.now_us())
            if name is not None:
                return fakeredis.reply("ok", fakeredis.now_us(), ["gone"])
            if args[0].upper() == b"XREAD":
                time.sleep(0.2)
                return bulk(None)
            return status("OK")
        return self.fake(behaviour)

    def wait_up(self, b, timeout=30):
        wait_for(lambda: b.pool("shared")["backend"]["up"], timeout=timeout, message="the shared pool up")

    def assert_ended_and_back(self, b, sentence, timeout=30):
        wait_for(lambda: sentence in b.log() or not b.alive(), timeout=timeout, message=sentence)
        self.assertTrue(b.alive(), b.log()[-3000:])
        self.assertIn(sentence, b.log())
        self.wait_up(b)
        self.assertTrue(b.alive())

    # ---- hiredis's assert in redisProcessCallbacks() ----

    def test_a_script_answered_twice(self):
        for kind, tail in TAILS.items():
            with self.subTest(kind=kind):
                sent = []

                def hostile(c, args, tail=tail, sent=sent):
                    if fakeredis.script_of(c, args)[0] == "tick" and not sent:
                        sent.append(True)
                        return fakeredis.tick_ok(fakeredis.now_us()) + tail
                    return None
                f = self.redis(hostile)
                b = self.broker(config(f.url()), f"twice-{kind}")
                self.assert_ended_and_back(b, "Not a Redis server: A reply to no command")
                self.assertIn("not-redis", b.log())
                self.assertGreaterEqual(len(f.connections), 3, "the commands link connected again")

    def test_a_stream_read_answered_twice(self):
        sent = []

        def hostile(c, args):
            if args[0].upper() == b"XREAD" and not sent:
                # Nothing, at once: the next read waits (paced); meanwhile a reply to no command.
                sent.append(True)

                def later():
                    time.sleep(0.3)
                    try:
                        c.send(status("OK"))
                    except OSError:
                        pass
                threading.Thread(target=later, daemon=True).start()
                return bulk(None)
            return None
        f = self.redis(hostile)
        b = self.broker(config(f.url()), "xread-twice")
        self.wait_up(b)
        self.acquire(b, "shared")  # a waiter: the stream is read
        wait_for(lambda: sent, timeout=20, message="an XREAD")
        wait_for(lambda: "A reply to no command" in b.log() or not b.alive(), timeout=20, message="the reader ended")
        self.assertTrue(b.alive(), b.log()[-3000:])
        n = f.count("XREAD")
        wait_for(lambda: f.count("XREAD") > n, timeout=20, message="the stream read again")
        self.assertTrue(b.alive())

    # ---- a server that keeps brokerd calling ----

    def test_a_stream_read_answered_at_once(self):
        def hostile(c, args):
            return bulk(None) if args[0].upper() == b"XREAD" else None
        f = self.redis(hostile)
        b = self.broker(config(f.url()), "xread-spin", debug=False)
        self.wait_up(b)
        self.acquire(b, "shared")  # a waiter: the stream is read
        wait_for(lambda: f.count("XREAD") > 0, timeout=20, message="an XREAD")
        n = f.count("XREAD")
        time.sleep(3)  # a window to count in, not a synchronisation
        reads = f.count("XREAD") - n
        # Paced by READ_RETRY (1 s): about 3. Unpaced: a round trip each, tens of thousands.
        self.assertLessEqual(reads, 10, f"{reads} XREADs in 3 s")
        self.assertTrue(b.alive())

    def test_a_call_answered_settling_for_ever(self):
        settle = []

        def hostile(c, args):
            if settle and fakeredis.script_of(c, args)[0] is not None:
                return fakeredis.reply("settling", fakeredis.now_us(), [], cache_value=fakeredis.cache())
            return None
        f = self.redis(hostile)
        b = self.broker(config(f.url()), "settling", debug=False)
        self.wait_up(b)
        settle.append(True)
        n = f.count("FCALL")
        time.sleep(3)  # a window to count in, not a synchronisation
        calls = f.count("FCALL") - n
        # 256 in a row, then a heartbeat's pause (1 s): about 1000 at most. Unbounded: tens of thousands.
        self.assertLessEqual(calls, 2000, f"{calls} FCALLs in 3 s")
        self.assertGreaterEqual(bad_input_total(b) or 0, 1)
        self.assertTrue(b.alive())
        # A server that answers again is followed again.
        settle.clear()
        n = f.count("FCALL")
        wait_for(lambda: f.count("FCALL") > n + 2, timeout=20, message="calls again")
        self.wait_up(b)

    def test_a_sentinel_query_answered_twice(self):
        redis = self.redis()
        sent = []

        def sentinel(fake, c, args):
            name = args[0].upper()
            if name == b"AUTH":
                return status("OK")
            if name == b"INFO":
                return bulk(SENTINEL_INFO)
            if name == b"SENTINEL":
                out = array(bulk("127.0.0.1"), bulk(str(redis.port)))
                if not sent:
                    sent.append(True)
                    return out + status("OK")
                return out
            if name == b"SUBSCRIBE":
                return array(bulk("subscribe"), bulk(args[1]), integer(1))
            return status("OK")
        s = self.fake(sentinel)
        b = self.broker(config(f"redis-sentinel://127.0.0.1:{s.port}/mymaster"), "sentinel-twice")
        self.assert_ended_and_back(b, "Not a Redis server: A reply to no command")
        self.assertGreaterEqual(s.count("SENTINEL"), 2)

    # ---- hiredis's asserts in __redisGetSubscribeCallback() ----

    def test_a_sentinels_malformed_messages(self):
        for variant, bad in PUBSUB.items():
            with self.subTest(variant=variant):
                redis = self.redis()
                sent = []

                def sentinel(fake, c, args, bad=bad, sent=sent):
                    name = args[0].upper()
                    if name == b"AUTH":
                        return status("OK")
                    if name == b"INFO":
                        return bulk(SENTINEL_INFO)
                    if name == b"SENTINEL":
                        return array(bulk("127.0.0.1"), bulk(str(redis.port)))
                    if name == b"SUBSCRIBE":
                        out = array(bulk("subscribe"), bulk(args[1]), integer(1))
                        if not sent:
                            sent.append(True)
                            return out + bad
                        return out
                    return status("OK")
                s = self.fake(sentinel)
                b = self.broker(config(f"redis-sentinel://127.0.0.1:{s.port}/mymaster"), f"pubsub-{variant}")
                wait_for(lambda: sent, timeout=20, message="the subscription")
                self.assert_ended_and_back(b, "Not a Redis server: A pub/sub message")
                wait_for(lambda: s.count("SUBSCRIBE") >= 2, timeout=30, message="a new subscription")
                self.assertTrue(b.alive())


if __name__ == "__main__":
    (_,), argv = harness.arguments(__doc__, 1)
    harness.main(argv)
