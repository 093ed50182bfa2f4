#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""sentineld.py — Redis Sentinel topologies for the tests and benchmarks (issue 12), on private loopback
ports, every process stopped by its pid: a primary and a replica (redisd.RedisServer) and Sentinels
(`redis-server CONF --sentinel`, which Debian's redis-server package runs without redis-sentinel).

    t = Topology(tmpdir, sentinels=3, down_after=1.0).start()   # ready for a failover when this returns
    Topology(tmpdir, sentinels=1, password="pw")                 # Sentinels with requirepass
    t.url()                                      # "redis-sentinel://127.0.0.1:P1,…/grid-redis"
    t.fail_over()                                # kill -9 of the primary; returns once it is replaced
    t.rejoin()                                   # the killed one back, as the new primary's replica
    t.close()

Python 3 standard library only; imported beside harness.py.
"""
import os
import signal
import socket
import subprocess
import sys
import time

import redisd
from harness import wait_for
from redisd import RedisServer, Resp, RespError
from tcpproxy import TcpProxy

MASTER = "grid-redis"


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SentinelServer:
    """`redis-server CONF --sentinel` in a directory of its own, monitoring MASTER; stopped by its pid."""

    def __init__(self, tmpdir, primary_port, index, down_after, quorum=2, password=None):
        self.dir = os.path.join(tmpdir, f"sentinel-{index}")
        os.makedirs(self.dir)
        self.port = _free_port()
        self.conf = os.path.join(self.dir, "sentinel.conf")
        self.log_path = os.path.join(self.dir, "sentinel.log")
        with open(self.conf, "w") as f:
            f.write(f"port {self.port}\nbind 127.0.0.1\ndaemonize no\ndir {self.dir}\nlogfile {self.log_path}\n"
                    f"sentinel monitor {MASTER} 127.0.0.1 {primary_port} {quorum}\n"
                    f"sentinel down-after-milliseconds {MASTER} {int(down_after * 1000)}\n"
                    f"sentinel failover-timeout {MASTER} 10000\n"
                    f"sentinel parallel-syncs {MASTER} 1\n")
            if password:
                # requirepass for clients; sentinel-pass for the other Sentinels, which need it too.
                f.write(f"requirepass {password}\nsentinel sentinel-pass {password}\n")
        self.password = password
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([redisd.REDIS_SERVER, self.conf, "--sentinel"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, close_fds=True,
                                     preexec_fn=redisd._die_with_parent)
        wait_for(lambda: self._pings(), timeout=20, message=f"Sentinel on port {self.port}")
        return self

    def _pings(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"redis-server --sentinel exited:\n{self.log()[-2000:]}")
        try:
            return self.call("PING") == "PONG"
        except (OSError, RespError, TimeoutError):
            return False

    def call(self, *args):
        with Resp(("127.0.0.1", self.port), password=self.password, timeout=2.0) as c:
            return c.call(*args)

    def master(self):
        reply = self.call("SENTINEL", "master", MASTER)
        return dict(zip(reply[::2], reply[1::2]))

    def primary_port(self):
        return int(self.call("SENTINEL", "get-master-addr-by-name", MASTER)[1])

    def kill9(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""




class Topology:
    """A primary, a replica and `sentinels` Sentinels (quorum: a majority) monitoring it as MASTER."""

    def __init__(self, tmpdir, sentinels=3, down_after=1.0, password=None, proxied=False):
        self.tmpdir, self.n_sentinels, self.down_after = tmpdir, sentinels, down_after
        self.password = password  # the Sentinels' requirepass
        # proxied: the Sentinels monitor the primary through a TcpProxy (self.proxy), so they name the proxy's
        # address to brokerd as well, and its replica replicates through it: blackholing it partitions the
        # first primary from all of them (self.proxy.spare(pid) keeps one brokerd with it).
        self.proxied = proxied
        self.proxy = None
        self.primary = self.replica = None
        self.sentinels = []

    def start(self):
        self.primary = RedisServer(self.tmpdir, unix=False, name="primary").start()
        monitored = self.primary.port
        if self.proxied:
            self.proxy = TcpProxy(self.primary.tcp_address, name="primary-proxy").start()
            monitored = self.proxy.port
        self.replica = RedisServer(self.tmpdir, unix=False, name="replica",
                                   config={"replicaof": f"127.0.0.1 {monitored}"}).start()
        wait_for(lambda: self.replica.replication().get("master_link_status") == "up", timeout=30,
                 message="the replica to sync")
        for i in range(self.n_sentinels):
            self.sentinels.append(SentinelServer(self.tmpdir, monitored, i, self.down_after,
                                                 quorum=self.n_sentinels // 2 + 1, password=self.password).start())
        self.wait_ready()
        return self

    def live_sentinels(self):
        return [s for s in self.sentinels if s.proc.poll() is None]

    def wait_ready(self):
        """Until every live Sentinel knows the others and a replica it could promote (hello messages come
        every 2 s; a replica back from the dead is usable once it is no longer flagged down)."""
        def ready(s):
            m = s.master()
            replicas = s.call("SENTINEL", "replicas", MASTER)
            usable = [dict(zip(r[::2], r[1::2])) for r in replicas]
            usable = [r for r in usable if r.get("flags") == "slave" and r.get("master-link-status") == "ok"]
            return int(m["num-other-sentinels"]) == self.n_sentinels - 1 and len(usable) >= 1
        wait_for(lambda: all(ready(s) for s in self.live_sentinels()), timeout=60,
                 message="the Sentinels to know each other and a replica")

    def url(self, db=None):
        return ("redis-sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels) + f"/{MASTER}" +
                (f"?db={db}" if db is not None else ""))

    def fail_over(self):
        """kill -9 of the primary; returns the monotonic time of the kill once a live Sentinel names the
        replica. The roles swap: self.primary is the new one, self.replica the dead one."""
        killed = time.monotonic()
        self.primary.kill9()
        new = self.replica
        wait_for(lambda: self.live_sentinels()[-1].primary_port() == new.port, timeout=30,
                 message="the Sentinels to promote the replica")
        self.primary, self.replica = new, self.primary
        return killed

    def rejoin(self, sentinel_timeout=30):
        """The killed server started again, empty, on its port: the Sentinels make it the new primary's
        replica (+convert-to-slave); returns once it is synced and usable for the next failover. They
        usually do within 5-20 s, but may wait much longer (a Sentinel in TILT mode acts on nothing for
        30 s): after sentinel_timeout the harness sends the REPLICAOF itself, as a Sentinel would."""
        self.replica.restart(keep_data=False)

        def synced():
            return self.replica.replication().get("master_link_status") == "up"
        try:
            wait_for(synced, timeout=sentinel_timeout, message="the Sentinels to make the old primary a replica")
        except AssertionError:
            print(f"rejoin: no Sentinel converted 127.0.0.1:{self.replica.port} within {sentinel_timeout} s: "
                  f"REPLICAOF sent by the harness", file=sys.stderr)
            self.replica.call("REPLICAOF", "127.0.0.1", self.primary.port)
            wait_for(synced, timeout=60, message="the old primary to sync as a replica")
        self.wait_ready()

    def close(self):
        for s in self.sentinels:
            s.kill9()
        if self.proxy:
            self.proxy.close()
        for r in (self.primary, self.replica):
            if r:
                r.close()
