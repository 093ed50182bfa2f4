# SPDX-License-Identifier: MIT
"""benchlua.py — what the benchmarks of the shared pools' scripts share: redisd.py (the integration tests'
private redis-server), tools/embed-lua-library.py (the library as brokerd builds it), where the scripts are,
and a library made of them.

    from benchlua import LUA, embed, library, private_redis, redisd
"""
import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import redisd  # noqa: E402,F401

LUA = os.path.join(HERE, "..", "..", "brokerd", "lua")
_spec = importlib.util.spec_from_file_location("embed_lua_library",
                                               os.path.join(HERE, "..", "..", "tools", "embed-lua-library.py"))
embed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(embed)


def lease_hash(rid):
    """A submit's ARGV[16] as brokerd sends it: FNV-1a 32 of rid then "l" (brokerd/lua/README, "Fingerprint")."""
    h = 2166136261
    for c in rid.encode() + b"l":
        h = ((h ^ c) * 16777619) & 0xFFFFFFFF
    return h


def submit_args(rid):
    """An immediate submit's ARGV[6…] as brokerd sends a new request's: lane ci, 1 slot, may wait, no budget, no
    cap, arrival now, any slot, fresh, its lease hash."""
    return (rid, "ci", 1, 1, 0, -1, -1, "-", "", "1", lease_hash(rid))


def library(ops, label, where=LUA):
    """The Redis Functions library of where's prelude.lua and the operations ops (names, in order), as
    brokerd embeds it: (text, digest)."""
    def read(name):
        with open(os.path.join(where, name + ".lua"), "rb") as f:
            return f.read()
    text, digest = embed.library(read("prelude"), [(op, read(op)) for op in ops], label)
    return text.decode(), digest


@contextlib.contextmanager
def private_redis(prefix):
    """A redis-server of its own (loopback, a private port; its directory server.dir), stopped by pid and its
    directories removed on the way out."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        server = redisd.RedisServer(tmp, port=0, unix=False).start()
        try:
            yield server
        finally:
            server.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
