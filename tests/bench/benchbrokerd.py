# SPDX-License-Identifier: MIT
"""benchbrokerd.py — a brokerd as the benchmarks that run one start it: its own config, socket and state
directory, output dropped, ready once it has answered a Status, ended with the block. A brokerd that exits
before it is ready ends the benchmark, naming it.

    with started(BROKERD, conf, sock, state) as (proc, ready):  # ready: seconds from exec to the first Status answer
"""
import contextlib
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
