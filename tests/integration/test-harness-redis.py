#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The fault harness of the shared-pool tests, tested on its own: tcpproxy.py's rules against a plain echo
server and against redis-server, redisd.py's server control (restarts keeping or losing data, CLIENT PAUSE,
SIGSTOP, configuration, passwords), witness.py's checks for several brokerds (each shown to catch what it
is for), faults.py's seeded schedule (reproducible from its seed), its faults on Redis and the proxies,
and its test for shared pools in brokerd (against stand-ins, and the brokerd under test if given).

Checks that nothing arrives during a blackhole look for a while and can only pass wrongly on a slow machine,
never fail; every other wait is on a condition. The redis-server cases skip without redis-server.

Usage: test-harness-redis.py [BROKERD] [unittest arguments]
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.dont_write_bytecode = True
import faults  # noqa: E402
import harness  # noqa: E402
import redisd  # noqa: E402
from harness import wait_for  # noqa: E402
from redisd import RedisServer, Resp, RespError  # noqa: E402
from tcpproxy import TcpProxy  # noqa: E402
from witness import Witness  # noqa: E402

# How long a check that nothing arrives looks: long enough for a forwarded byte to arrive on any machine
# not stopped outright, and a check that passes wrongly when slower is no harm.
QUIET = 0.5
# How much earlier than asked Redis may end a CLIENT PAUSE by this process's clock (its clock is its cached
# millisecond wall clock): far below the pause, so a pause that held nothing still fails.
PAUSE_CLOCK_SLACK = 0.05


class EchoServer:
    """Echoes every byte back on 127.0.0.1; counts what it received and the connections reset on it."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.address = self.sock.getsockname()
        self.received = 0
        self.resets = 0
        self.eofs = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        with c:
            while True:
                try:
                    data = c.recv(65536)
                except ConnectionResetError:
                    with self.lock:
                        self.resets += 1
                    return
                except OSError:
                    return
                if not data:
                    with self.lock:
                        self.eofs += 1
                    return
                with self.lock:
                    self.received += len(data)
                try:
                    c.sendall(data)
                except OSError:
                    return

    def close(self):
        self.sock.close()


def connect(address, timeout=5.0):
    s = socket.create_connection(address, timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exactly(s, n, timeout=5.0):
    s.settimeout(timeout)
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"EOF after {data!r}")
        data += chunk
    return data


def nothing_arrives(s):
    """True if nothing (not even an EOF) can be read from s for QUIET seconds."""
    s.settimeout(QUIET)
    try:
        s.recv(1)
        return False
    except socket.timeout:
        return True


SPARED_CHILD = r"""
import socket, sys
port, conns = int(sys.argv[1]), {}
for line in sys.stdin:
    name, text = line.split()
    if name not in conns:
        conns[name] = socket.create_connection(("127.0.0.1", port), timeout=10)
    conns[name].sendall(text.encode())
    got = b""
    while len(got) < len(text):
        got += conns[name].recv(len(text) - len(got))
    print(got.decode(), flush=True)
"""


class ProxyTestCase(unittest.TestCase):
    def setUp(self):
        self.echo = EchoServer()
        self.addCleanup(self.echo.close)
        self.proxy = TcpProxy(self.echo.address).start()
        self.addCleanup(self.proxy.close)

    def client(self):
        s = connect(self.proxy.address)
        self.addCleanup(s.close)
        return s


class TestProxyEcho(ProxyTestCase):
    def test_listens_on_loopback_only(self):
        self.assertEqual(self.proxy.address[0], "127.0.0.1")
        self.assertEqual(self.proxy._listener.getsockname()[0], "127.0.0.1")

    def test_pass_forwards_both_ways(self):
        s = self.client()
        s.sendall(b"hello")
        self.assertEqual(recv_exactly(s, 5), b"hello")
        big = os.urandom(3 << 20)  # beyond the high-water mark: flow control, nothing lost or reordered
        threading.Thread(target=s.sendall, args=(big,), daemon=True).start()
        self.assertEqual(recv_exactly(s, len(big), timeout=30), big)
        st = self.proxy.stats()
        self.assertEqual(st["forwarded_up"], 5 + len(big))
        self.assertEqual(st["forwarded_down"], 5 + len(big))
        self.assertEqual(self.proxy.rules(), {"up": "pass", "down": "pass"})

    def test_eof_is_passed_on_and_the_connection_closed(self):
        s = self.client()
        s.sendall(b"x")
        recv_exactly(s, 1)
        s.shutdown(socket.SHUT_WR)
        self.assertEqual(recv_exactly(s, 0), b"")
        s.settimeout(5)
        self.assertEqual(s.recv(1), b"")  # the echo server closed its side in turn
        wait_for(lambda: self.proxy.connections() == 0, message="the proxied connection closed")
        self.assertEqual(self.echo.eofs, 1)

    def test_blackhole_holds_traffic_until_it_heals(self):
        s = self.client()
        s.sendall(b"a")
        recv_exactly(s, 1)
        self.proxy.blackhole()
        self.assertEqual(self.proxy.rules(), {"up": "blackhole", "down": "blackhole"})
        s.sendall(b"held")
        self.assertTrue(nothing_arrives(s))
        self.assertEqual(self.echo.received, 1, "a byte passed the blackhole")
        # A new connection is accepted (the kernel completes the handshake) and gets nothing through.
        s2 = self.client()
        s2.sendall(b"new")
        self.assertTrue(nothing_arrives(s2))
        self.assertEqual(self.echo.received, 1)
        self.proxy.passthrough()
        # Healed before TCP gave up: what was held flows, in order, on the same connections.
        self.assertEqual(recv_exactly(s, 4), b"held")
        self.assertEqual(recv_exactly(s2, 3), b"new")
        self.assertEqual(self.proxy.stats()["resets"], 0)

    def test_blackhole_with_a_duration_ends_by_itself(self):
        s = self.client()
        start = time.monotonic()
        self.proxy.blackhole(1.0)
        s.sendall(b"late")
        self.assertEqual(recv_exactly(s, 4, timeout=10), b"late")
        self.assertGreaterEqual(time.monotonic() - start, 1.0)
        wait_for(self.proxy.passing, message="the rule back to pass")

    def test_blackhole_drop_loses_bytes_and_resets_the_stream_when_it_heals(self):
        s = self.client()
        s.sendall(b"a")
        recv_exactly(s, 1)
        quiet = self.client()  # sends nothing during the blackhole: lost nothing, survives it
        self.proxy.blackhole(drop=True)
        s.sendall(b"lost")
        wait_for(lambda: self.proxy.stats()["dropped_up"] == 4, message="the proxy to read and drop 4 bytes")
        self.proxy.passthrough()
        s.settimeout(5)
        with self.assertRaises(ConnectionResetError):
            s.recv(1)
        self.assertEqual(self.echo.received, 1)
        wait_for(lambda: self.echo.resets == 1, message="the echo server's side reset too")
        quiet.sendall(b"ok")
        self.assertEqual(recv_exactly(quiet, 2), b"ok")

    def test_blackhole_of_one_direction(self):
        s = self.client()
        self.proxy.blackhole(direction="down")
        self.assertEqual(self.proxy.rules(), {"up": "pass", "down": "blackhole"})
        s.sendall(b"up")
        wait_for(lambda: self.echo.received == 2, message="the bytes to reach the server")
        self.assertTrue(nothing_arrives(s))
        self.proxy.passthrough("down")
        self.assertEqual(recv_exactly(s, 2), b"up")
        self.proxy.blackhole(direction="up")
        s.sendall(b"held")
        self.assertTrue(nothing_arrives(s))
        self.assertEqual(self.echo.received, 2)

    def test_spare_exempts_one_process_from_the_rules(self):
        # Another process with connections of its own through the proxy: each line it reads names a
        # connection ("a" open before spare(), "b" opened after the blackhole) and the text to echo through it.
        child = subprocess.Popen([sys.executable, "-c", SPARED_CHILD, str(self.proxy.port)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        self.addCleanup(child.wait)
        self.addCleanup(child.stdin.close)

        def echo(conn, text):
            child.stdin.write(f"{conn} {text}\n")
            child.stdin.flush()
            return child.stdout.readline().strip()

        self.assertEqual(echo("a", "before"), "before")
        mine = self.client()
        self.assertEqual(self.proxy.spare(child.pid), 1)
        self.proxy.blackhole(drop=True)
        self.assertEqual(echo("a", "through"), "through")
        self.assertEqual(echo("b", "accepted"), "accepted")  # spared at accept too
        mine.sendall(b"lost")
        self.assertTrue(nothing_arrives(mine))
        self.assertEqual(self.proxy.spare(None), 0)
        self.proxy.passthrough()

    def test_reset_sends_an_rst_both_ways(self):
        s1, s2 = self.client(), self.client()
        for s in (s1, s2):
            s.sendall(b"x")
            recv_exactly(s, 1)
        self.assertEqual(self.proxy.reset(), 2)
        for s in (s1, s2):
            s.settimeout(5)
            with self.assertRaises(ConnectionResetError):
                s.recv(1)
        wait_for(lambda: self.echo.resets == 2, message="the server's side reset")
        self.assertEqual(self.proxy.connections(), 0)
        s3 = self.client()  # no refuse_for: the next connection passes
        s3.sendall(b"y")
        self.assertEqual(recv_exactly(s3, 1), b"y")

    def test_reset_refuses_new_connections_for_a_while(self):
        self.proxy.reset(refuse_for=60)
        # The kernel accepts it; the proxy resets it as soon as it sees it: at connect() already, or later.
        with self.assertRaises(ConnectionResetError), connect(self.proxy.address) as s:
            s.sendall(b"x")
            s.recv(1)
        self.assertEqual(self.proxy.stats()["refused"], 1)
        self.assertEqual(self.echo.received, 0)

    def test_delay_holds_every_chunk_for_its_time_in_order(self):
        s = self.client()
        self.proxy.delay(1.0, direction="up")
        self.assertEqual(self.proxy.rules(), {"up": "delay 1s", "down": "pass"})
        sent = time.monotonic()
        s.sendall(b"one")
        time.sleep(0.05)
        s.sendall(b"two")
        self.proxy.passthrough()  # later chunks wait behind the delayed ones: a stream keeps its order
        s.sendall(b"three")
        self.assertEqual(recv_exactly(s, 11, timeout=10), b"onetwothree")
        self.assertGreaterEqual(time.monotonic() - sent, 1.0)

    def test_delay_with_a_duration_ends_by_itself(self):
        s = self.client()
        self.proxy.delay(0.5, duration=0.2)
        wait_for(self.proxy.passing, message="the delay's end")
        sent = time.monotonic()
        s.sendall(b"now")
        self.assertEqual(recv_exactly(s, 3), b"now")
        self.assertLess(time.monotonic() - sent, 0.5 + harness.LATENESS)

    def test_target_that_refuses_resets_the_client(self):
        port = socket.socket()
        port.bind(("127.0.0.1", 0))
        closed = port.getsockname()
        port.close()
        with TcpProxy(closed) as p:
            with self.assertRaises(ConnectionResetError):  # at connect() already, or at the first recv()
                with connect(p.address) as s:
                    s.settimeout(5)
                    s.recv(1)
            self.assertEqual(p.stats()["refused"], 1)


class RedisTestCase(unittest.TestCase):
    def setUp(self):
        redisd.require_redis_server()
        self.tmp = tempfile.mkdtemp(prefix="test-harness-redis-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def server(self, **kw):
        r = RedisServer(self.tmp, **kw).start()
        self.addCleanup(r.close)
        return r


class TestRedisServer(RedisTestCase):
    def test_unix_socket_and_tcp_port_and_urls(self):
        r = self.server(port=0)
        self.assertTrue(r.socket_path.startswith(self.tmp))
        self.assertEqual(r.url(3), f"unix://{r.socket_path}?db=3")
        self.assertEqual(r.url(0, tcp=True), f"redis://127.0.0.1:{r.port}/0")
        self.assertEqual(r.call("PING"), "PONG")
        with Resp(r.tcp_address, db=3) as c:
            c.call("SET", "k", "v")
        self.assertEqual(r.call("GET", "k", db=3), "v")
        self.assertIsNone(r.call("GET", "k"))
        self.assertEqual(r.config_get("maxmemory-policy"), "noeviction")
        self.assertEqual(r.config_get("save"), "")

    def test_servers_get_directories_of_their_own(self):
        a, b = RedisServer(self.tmp), RedisServer(self.tmp)
        a.close()
        c = RedisServer(self.tmp)  # the numbering does not reuse a closed server's number
        self.assertEqual(len({a.dir, b.dir, c.dir}), 3)
        for r in (b, c):
            r.close()

    def test_tcp_only(self):
        r = self.server(unix=False)
        self.assertIsNone(r.socket_path)
        self.assertEqual(r.address, ("127.0.0.1", r.port))
        self.assertEqual(r.url(), f"redis://127.0.0.1:{r.port}/0")
        self.assertEqual(r.call("PING"), "PONG")

    def test_stop_by_pid(self):
        r = self.server()
        pid = r.pid
        self.assertEqual(r.stop(), 0)
        self.assertFalse(harness.pid_alive(pid))
        with self.assertRaises(OSError):
            Resp(r.address)

    def test_password(self):
        r = self.server(password="s3cret")
        with Resp(r.address) as c, self.assertRaisesRegex(RespError, "NOAUTH"):
            c.call("PING")
        with self.assertRaisesRegex(RespError, "WRONGPASS|invalid password"):
            Resp(r.address, password="wrong")
        self.assertEqual(r.call("PING"), "PONG")  # r's own client authenticates

    def test_eviction_policy(self):
        r = self.server(policy="allkeys-lru")
        self.assertEqual(r.config_get("maxmemory-policy"), "allkeys-lru")
        r.config_set("maxmemory-policy", "noeviction")
        self.assertEqual(r.info("memory")["maxmemory_policy"], "noeviction")

    def test_restart_losing_data(self):
        r = self.server(port=0, appendonly=True)
        port, before = r.port, r.run_id()
        r.call("SET", "k", "v")
        after = r.restart(keep_data=False)
        self.assertNotEqual(after, before)
        self.assertEqual(r.port, port, "a restart keeps the addresses")
        self.assertIsNone(r.call("GET", "k"))

    def test_restart_keeping_data_without_aof(self):
        r = self.server()
        r.call("SET", "k", "v")
        r.restart(keep_data=True)
        self.assertEqual(r.call("GET", "k"), "v")

    def test_kill9_keeps_what_the_aof_had(self):
        r = self.server(appendonly=True, appendfsync="always")
        r.call("SET", "k", "v")
        r.restart(keep_data=True, kill=True)
        self.assertEqual(r.call("GET", "k"), "v")

    def test_kill9_without_aof_loses_everything(self):
        r = self.server()
        r.call("SET", "k", "v")
        r.restart(keep_data=True, kill=True)
        self.assertIsNone(r.call("GET", "k"))

    def test_client_pause_holds_commands(self):
        r = self.server()
        c = r.client()
        self.addCleanup(c.close)
        start = time.monotonic()
        r.pause(700)
        self.assertEqual(c.call("SET", "k", "v", timeout=30), "OK")
        # Redis ends a pause by its cached millisecond wall clock, which may lag this clock by part of an
        # event-loop pass (0.6986 s seen): the SET was held if it waited most of the 700 ms; unpaused it
        # answers within a few.
        self.assertGreaterEqual(time.monotonic() - start, 0.7 - PAUSE_CLOCK_SLACK)

    def test_sigstop_and_sigcont(self):
        r = self.server()
        c = r.client(timeout=QUIET)
        self.addCleanup(c.close)
        r.sigstop()
        self.addCleanup(lambda: r.stopped and r.sigcont())
        with self.assertRaises(TimeoutError):
            c.call("PING")
        r.sigcont()
        self.assertEqual(c.read(timeout=10), "PONG")  # the stopped server answered once continued
        r.sigstop()
        self.assertEqual(r.stop(), 0, "stop() continues a stopped server to end it cleanly")

    def test_not_redis_is_an_error(self):
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        self.addCleanup(srv.close)

        def answer():
            c, _ = srv.accept()
            c.recv(100)
            c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            c.close()
        threading.Thread(target=answer, daemon=True).start()
        with Resp(srv.getsockname()) as c, self.assertRaisesRegex(ConnectionError, "does not speak RESP"):
            c.call("PING")

    def test_skips_without_redis_server(self):
        saved = redisd.REDIS_SERVER
        redisd.REDIS_SERVER = None
        try:
            with self.assertRaisesRegex(unittest.SkipTest, "redis-server is not installed"):
                RedisServer(self.tmp)
        finally:
            redisd.REDIS_SERVER = saved


class TestProxyRedis(RedisTestCase):
    """The proxy's rules between a RESP client and a real redis-server on a Unix socket."""

    def setUp(self):
        super().setUp()
        self.redis = self.server()
        self.proxy = TcpProxy(self.redis.address).start()
        self.addCleanup(self.proxy.close)

    def test_pass(self):
        with Resp(self.proxy.address) as c:
            self.assertEqual(c.call("PING"), "PONG")
            self.assertEqual(c.call("SET", "k", "v"), "OK")
        self.assertEqual(self.redis.call("GET", "k"), "v")

    def test_blackhole(self):
        c = Resp(self.proxy.address, timeout=QUIET)
        self.addCleanup(c.close)
        self.proxy.blackhole()
        with self.assertRaises(TimeoutError):
            c.call("PING")
        with Resp(self.proxy.address, timeout=QUIET) as c2, self.assertRaises(TimeoutError):
            c2.call("PING")  # a new connection is no better
        self.proxy.passthrough()
        self.assertEqual(c.read(timeout=10), "PONG")

    def test_reset(self):
        c = Resp(self.proxy.address)
        self.addCleanup(c.close)
        c.call("PING")
        self.proxy.reset()
        with self.assertRaises((ConnectionResetError, ConnectionError)):
            c.call("PING")
        wait_for(lambda: int(self.redis.info("clients")["connected_clients"]) == 1,
                 message="Redis to drop the proxied connection (only the INFO's own left)")
        with Resp(self.proxy.address) as c2:
            self.assertEqual(c2.call("PING"), "PONG")

    def test_delay(self):
        with Resp(self.proxy.address, timeout=30) as c:
            self.proxy.delay(1.0, direction="down")
            sent = time.monotonic()
            self.assertEqual(c.call("PING"), "PONG")
            self.assertGreaterEqual(time.monotonic() - sent, 1.0)


def harness_zombie(pid):
    """True once pid is a zombie (dead, not reaped)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return False


class TestWitnessShared(unittest.TestCase):
    """witness.py's checks for several brokerds, fed by its own script run as `slotctl run` would run it."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="test-witness-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.w = Witness(self.dir)

    def run_cmd(self, pool, token, slots, name=None, body="true"):
        env = dict(os.environ, SLOT_POOL=pool, SLOT_TOKEN=str(token), SLOT_INDEX=",".join(map(str, slots)))
        subprocess.run(self.w.command(body, name), env=env, check=True, timeout=30)

    def start_cmd(self, pool, token, slots, name):
        env = dict(os.environ, SLOT_POOL=pool, SLOT_TOKEN=str(token), SLOT_INDEX=",".join(map(str, slots)))
        p = subprocess.Popen(self.w.command_until_stopped(name), env=env)
        self.addCleanup(p.kill)
        wait_for(lambda: self.w.started(name), message=f"{name} to start")
        return p

    def end_cmd(self, p, name):
        self.w.stop(name)
        p.wait(30)

    def assert_fails(self, check, text):
        with self.assertRaisesRegex(AssertionError, text):
            check(self)

    def test_a_clean_history_passes(self):
        # Two "nodes" granting in turn: slot 0 by tokens 10 then 30, slot 1 by 20; the start order
        # (30 before 20) is not the token order, which only a single brokerd guarantees.
        a = self.start_cmd("grid", 10, [0], "a")
        self.end_cmd(a, "a")
        b = self.start_cmd("grid", 30, [0], "b")
        c = self.start_cmd("grid", 20, [1], "c")
        self.assertEqual(self.w.max_concurrent(), {"grid": 2})
        self.end_cmd(b, "b")
        self.end_cmd(c, "c")
        self.w.check_shared(self, {"grid": 2})
        self.assert_fails(self.w.check, "repeat or go back")  # the single-brokerd check is stricter

    def test_a_slot_held_twice_is_caught(self):
        a = self.start_cmd("grid", 1, [0], "a")
        self.run_cmd("grid", 2, [0])
        self.end_cmd(a, "a")
        self.assert_fails(self.w.check_fencing, "held twice")

    def start_set(self, name, token, slots, db_slots):
        """A set holder (pool grid, also db, as a lane with also= runs it) that runs until stopped or killed."""
        env = dict(os.environ, SLOT_POOL="grid", SLOT_TOKEN=str(token), SLOT_INDEX=",".join(map(str, slots)),
                   SLOT_DB_TOKEN=str(token), SLOT_DB_INDEX=",".join(map(str, db_slots)))
        p = subprocess.Popen(self.w.command_until_stopped(name, also=("db",)), env=env)
        self.addCleanup(p.kill)
        wait_for(lambda: len(self.w.started(name)) == 2, message=f"{name} to start in both pools")
        return p

    def test_a_killed_set_holder_held_nothing_in_any_of_its_pools(self):
        # SIGKILL before its trap gave its files back (a fence's end under load), then the next set holder:
        # in the set's other pool too, and while the killed one is a zombie (not reaped yet: kill -0 finds it).
        a = self.start_set("a", 1, [0], [0, 1])
        a.send_signal(signal.SIGKILL)
        wait_for(lambda: harness_zombie(a.pid), message="the killed holder a zombie")
        b = self.start_set("b", 2, [0], [0, 1])
        a.wait(10)
        self.end_cmd(b, "b")
        self.w.check_fencing(self)
        with open(os.path.join(self.dir, "stale")) as f:
            stale = f.read()
        self.assertEqual(stale.count(" found "), 3, stale)  # grid 0, db 0, db 1
        # A holder that lives is still caught in the set's other pool.
        c = self.start_set("c", 3, [1], [0])
        self.start_set("d", 4, [2], [0])
        self.end_cmd(c, "c")
        self.assert_fails(self.w.check_fencing, "d got db 0 while c")

    def test_a_token_given_twice_is_caught(self):
        self.run_cmd("grid", 5, [0])
        self.run_cmd("grid", 5, [1])
        self.assert_fails(self.w.check_fencing, "both got token 5")

    def test_tokens_going_back_on_a_slot_are_caught(self):
        self.run_cmd("grid", 9, [2])
        self.run_cmd("grid", 8, [2])
        self.assert_fails(self.w.check_fencing, "do not increase")

    def test_more_holders_than_the_limit_are_caught(self):
        procs = [(self.start_cmd("grid", t, [t], f"n{t}"), f"n{t}") for t in range(3)]
        procs.append((self.start_cmd("other", 1, [0], "o"), "o"))  # another pool's holders do not count
        self.w.check_limits(self, {"grid": 3})
        self.assert_fails(lambda t: self.w.check_limits(t, {"grid": 2}), "3 slots held at once, limit 2")
        for p, name in procs:
            self.end_cmd(p, name)
        self.assertEqual(self.w.max_concurrent()["grid"], 3, "a maximum, not the last count")


class TestFaultSchedule(unittest.TestCase):
    def test_reproducible_from_its_seed(self):
        a = faults.schedule(1234, count=25, nodes=3)
        self.assertEqual(a, faults.schedule(1234, count=25, nodes=3))
        self.assertNotEqual(a, faults.schedule(1235, count=25, nodes=3))

    def test_every_kind_at_least_once(self):
        for seed in range(20):
            s = faults.schedule(seed, count=20, nodes=3)
            self.assertEqual(len(s), 20)
            self.assertEqual({f.kind for f in s}, set(faults.KINDS), f"seed {seed}")
            for f in s:
                if f.kind in faults.NODE_KINDS:
                    self.assertIn(f.node, range(3))

    def test_seed_from_the_environment(self):
        os.environ[faults.SEED_VARIABLE] = "42"
        try:
            self.assertEqual(faults.seed(), 42)
        finally:
            del os.environ[faults.SEED_VARIABLE]
        self.assertIsInstance(faults.seed(), int)


FAKE_BROKERD = r"""
import os, socket, sys
kind = KIND
if "--check-config" in sys.argv:
    if kind == "refuses":
        sys.exit("brokerd.conf:3: unknown key 'backend'")
    sys.exit(0)
if kind == "old":
    sys.exit("brokerd: Failed to apply the configuration: Operation not supported")
if kind == "broken":
    sys.exit("brokerd: Failed to open the history: Input/output error")
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[sys.argv.index("--socket") + 1])
s.listen(4)
while True:  # until SIGTERM
    c, _ = s.accept()
    while c.recv(4096).find(b"\0") < 0:
        pass
    c.sendall(b'{"parameters":{"vendor":"fake"}}\0')
    c.close()
"""


class TestSharedPoolsBuilt(unittest.TestCase):
    """faults.shared_pools_built() against stand-ins for brokerd before and after issue 11."""

    def fake(self, kind):
        d = tempfile.mkdtemp(prefix="fake-brokerd-")
        self.addCleanup(shutil.rmtree, d, True)
        path = os.path.join(d, "brokerd")
        with open(path, "w") as f:
            f.write(f"#!{sys.executable}\n" + FAKE_BROKERD.replace("KIND", repr(kind)))
        os.chmod(path, 0o755)
        return path

    def test_brokerd_that_exits_operation_not_supported(self):
        self.assertEqual(faults.shared_pools_built(self.fake("old")), (False, faults.NOT_BUILT))

    def test_brokerd_whose_check_config_refuses_backend(self):
        built, reason = faults.shared_pools_built(self.fake("refuses"))
        self.assertFalse(built)
        self.assertIn(faults.NOT_BUILT, reason)
        self.assertIn("unknown key 'backend'", reason)

    def test_brokerd_that_runs_the_pool(self):
        self.assertEqual(faults.shared_pools_built(self.fake("new")), (True, None))

    def test_brokerd_that_fails_otherwise_is_a_failure(self):
        with self.assertRaisesRegex(AssertionError, "Input/output error"):
            faults.shared_pools_built(self.fake("broken"))

    def test_the_brokerd_under_test_answers_one_way_or_the_other(self):
        if not os.environ.get("BROKERD"):
            self.skipTest("BROKERD is not set (meson passes it)")
        built, reason = faults.shared_pools_built()
        self.assertIn((built, reason), ((True, None), (False, faults.NOT_BUILT)))


class TestFaultInjection(RedisTestCase):
    """The faults that touch Redis and the proxies, applied and undone (brokerd's own: test-shared-faults)."""

    def setUp(self):
        super().setUp()
        self.redis = self.server(appendonly=True)
        self.proxy = TcpProxy(self.redis.address).start()
        self.addCleanup(self.proxy.close)
        self.cluster = faults.Cluster(self.redis, [self.proxy], brokers=[])

    def test_redis_restart_keeping_and_losing_data(self):
        self.redis.call("SET", "k", "v")
        run_id = self.redis.run_id()
        self.cluster.inject(faults.Fault("redis-restart-aof", None, 0.0))
        self.assertNotEqual(self.redis.run_id(), run_id)
        self.assertEqual(self.redis.call("GET", "k"), "v")
        self.cluster.inject(faults.Fault("redis-restart-lost", None, 0.0))
        self.assertIsNone(self.redis.call("GET", "k"))

    def test_proxy_faults_hit_and_end_with_the_proxy_passing(self):
        for kind in ("blackhole", "delay"):
            with self.subTest(kind), Resp(self.proxy.address, timeout=QUIET) as c:
                hit = []
                self.cluster.inject(faults.Fault(kind, 0, 2 * QUIET),
                                    lambda at: hit.append(self.assertRaises(TimeoutError, c.call, "PING")))
                self.assertEqual(len(hit), 1)
                self.assertTrue(self.proxy.passing())
                self.assertEqual(c.read(timeout=10), "PONG")  # held, then delivered
        with Resp(self.proxy.address) as c:
            c.call("PING")
            self.cluster.inject(faults.Fault("reset", 0, 0.0))
            with self.assertRaises((ConnectionResetError, ConnectionError)):
                c.call("PING")

    def test_client_pause(self):
        answered = []
        start = time.monotonic()
        self.cluster.inject(faults.Fault("client-pause", None, 0.5),
                            lambda at: answered.append((self.redis.call("SET", "k", "v", timeout=30),
                                                        time.monotonic())))
        self.assertEqual(answered[0][0], "OK")
        self.assertGreaterEqual(answered[0][1] - start, 0.5, "a command during the pause was answered at once")


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-") and os.path.isfile(sys.argv[1]):
        os.environ["BROKERD"] = os.path.abspath(sys.argv.pop(1))
    harness.main()
