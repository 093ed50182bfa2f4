# SPDX-License-Identifier: MIT
"""benchbrokerd.py — a brokerd as the benchmarks that run one start it: its own config, socket and state
directory, output dropped, ready once it has answered a Status, ended with the block. A brokerd that exits
before it is ready ends the benchmark, naming it.

    with started(BROKERD, conf, sock, state) as (proc, ready):  # ready: seconds from exec to the first Status answer
    c = Client(sock); c.call("io.slotbroker.Acquire", {"lane": "w"})  # one call at a time; an error ends the benchmark
    cpu_seconds(proc.pid)  # its CPU time so far (utime + stime)
"""
import contextlib
import json
import os
import socket
import subprocess
import sys
import time

WHO = os.path.splitext(os.path.basename(sys.argv[0]))[0]


def _wait_ready(proc, sock, start):
    """Seconds from `start` to brokerd's first Status answer on `sock`."""
    while True:
        if proc.poll() is not None:
            sys.exit(f"{WHO}: brokerd exited {proc.returncode}")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                c.connect(sock)
                c.sendall(b'{"method":"io.slotbroker.Status"}\0')
                reply = b""
                while not reply.endswith(b"\0"):
                    chunk = c.recv(65536)
                    if not chunk:
                        break
                    reply += chunk
                if reply.endswith(b"\0"):
                    return time.monotonic() - start
        except OSError:
            time.sleep(0.001)


@contextlib.contextmanager
def started(brokerd, conf, sock, state):
    start = time.monotonic()
    proc = subprocess.Popen([brokerd, "--config", conf, "--socket", sock, "--state-directory", state],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc, _wait_ready(proc, sock, start)
    finally:
        proc.terminate()
        proc.wait()


class Client:
    """One connection, one call at a time: a call's reply parameters; an error or a closed connection ends the
    benchmark, naming it."""

    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.buf = b""

    def call(self, method, params):
        self.s.sendall(json.dumps({"method": method, "parameters": params}).encode() + b"\0")
        while b"\0" not in self.buf:
            chunk = self.s.recv(65536)
            if not chunk:
                sys.exit(f"{WHO}: brokerd closed the connection")
            self.buf += chunk
        msg, _, self.buf = self.buf.partition(b"\0")
        reply = json.loads(msg)
        if "error" in reply:
            sys.exit(f"{WHO}: {method}: {reply}")
        return reply.get("parameters", {})


def cpu_seconds(pid):
    """The process's CPU time (utime + stime, /proc/PID/stat), in seconds: the machine's load moves it far less
    than wall time."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
