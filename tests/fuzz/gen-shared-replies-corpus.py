#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes the seed corpus of fuzz-shared-replies (its input format is in fuzz-shared-replies.c): a valid
answer of every operation, and the hostile shapes of issue 19 g. Usage: gen-shared-replies-corpus.py DIR"""
import os
import sys

M64 = (1 << 64) - 1


def rid(n):
    """The n-th request's rid ("@0" for the first: fuzz-shared-replies.c), or a made-up one from 10 on."""
    if n <= 9:
        return "@%d" % (n - 1)
    return "%016x" % ((n * 0x9E3779B97F4A7C15) & M64)


def enc(v):
    if v is None:
        return b"$-1\r\n"
    if isinstance(v, bool):
        return b":%d\r\n" % int(v)
    if isinstance(v, int):
        return b":%d\r\n" % v
    if isinstance(v, str):
        v = v.encode()
    if isinstance(v, bytes):
        return b"$%d\r\n%s\r\n" % (len(v), v)
    return b"*%d\r\n" % len(v) + b"".join(enc(x) for x in v)


def cache(in_use=0, last=""):
    return [in_use, 0, 0, 0, 0, -1, 1, "e1", 0, last, 3]


def reply(status, body, events=(), c=None, notices=()):
    return [status, 1000000000, body, list(events), cache() if c is None else c, list(notices)]


def tick(fp=(0, 0, 0), last="0-0", to=""):
    return reply("ok", [1030000000, "e1", 0, "ok", [], list(fp), last, 1, to])


def decision(verdict, r, token=0, slots=(), members=(), refusal="", position=0):
    return [verdict, r, 1000000000, 0, refusal, "", "none", 0, -1, position, position + 1, token, list(slots),
            list(members)]


def entry(verdict, r, token="0", slots="", members="", refusal=""):
    f = ["verdict", verdict, "rid", r, "at", "1000000000", "wait", "0", "refusal", refusal, "reason", "",
         "state", "none", "idle", "0", "budget", "-1", "position", "0", "queued", "1", "token", token,
         "slots", slots, "members", members]
    return f


def R(v):
    return b"R" + enc(v)


def S(i, fields):
    return b"S" + enc(i) + enc(fields)


UP = b"C" + R(tick())


def A(k, wait=True):
    return b"A" + bytes([k - 1, 1 if wait else 0])


seeds = {
    "up": UP,
    "grant-at-once": UP + A(1) + b"C" + R(reply("ok", decision("granted", rid(1), 7, [0], ["a"]))) + b"L" + b"C"
    + R(reply("ok", ["released"])),
    "grant-two": UP + A(2) + b"C" + R(reply("ok", decision("granted", rid(1), 8, [1, 2], ["b", "c"]))),
    "queued-then-stream": UP + A(1) + b"C" + R(reply("ok", decision("queued", rid(1), position=2)))
    + S("5-1", entry("granted", rid(1), "9", "2", "c")),
    "refused": UP + A(1, False) + b"C" + R(reply("ok", decision("refused", rid(1), refusal="busy"))),
    "withdraw-late-grant": UP + A(1) + b"C" + R(reply("ok", decision("queued", rid(1)))) + b"W" + b"C"
    + S("6-1", entry("granted", rid(1), "11", "0", "a")) + R(reply("ok", ["withdrawn"])),
    "events-in-tick": UP + A(1) + b"C" + R(reply("ok", decision("queued", rid(1)))) + b"T\x0a" + b"C"
    + R(reply("ok", [1030000000, "e1", 0, "ok", [], [1, 0, 0], "0-0", 1, ""],
              events=[decision("granted", rid(1), 12, [0], ["a"]), ["congestion", 1000000000, 0, 1]])),
    "settling": UP + A(1) + b"C" + R(reply("settling", [])) + b"C" + R(reply("ok", decision("granted", rid(1), 7, [0], ["a"]))),
    "unregistered": UP + b"T\x0a" + b"C" + R(reply("unregistered", [])) + b"C" + R(tick()),
    "rules-mismatch": b"C" + R(reply("rules", [1030000000, "e1", 0, "rules", ["limit", "members"], [0, 0, 0], "0-0", 2, ""])),
    "version": b"C" + R(reply("version", [2], c=[])),
    "script-error": UP + A(1) + b"C" + R(None) + b"E" + enc(None),
    "error-reply": UP + A(1) + b"C" + b"R-NOSCRIPT No matching script\r\n",
    "link-flap": UP + A(1) + b"D" + b"U" + b"C" + R(tick()) + R(reply("ok", decision("queued", rid(1)))),
    "fence": UP + A(1) + b"C" + R(reply("ok", decision("granted", rid(1), 7, [0], ["a"]))) + b"D" + b"T\xff" * 2,
    "positions": UP + A(1) + b"C" + R(reply("ok", decision("queued", rid(1)))) + b"T\x05" + b"T\x05" + b"C"
    + R(tick()) + R(reply("ok", [["queued", 0, 1]])) + R(reply("ok", [decision("granted", rid(1), 13, [1], ["b"])])),
    "positions-gone": UP + A(1) + b"C" + R(reply("ok", decision("queued", rid(1)))) + b"T\x0a" + b"C" + R(tick())
    + R(reply("ok", [["gone"]])),
    "status": UP + b"C" + R(reply("ok", [[["ffff", "runner-2", rid(19), "ci", 5, 1, [0], ["a"]]],
                                         [["ffff", "runner-2", rid(18), "ci", 1, 1, 0]], 1])),
    "node-expired": UP + b"T\x0a" + b"C" + R(reply("ok", [1030000000, "e1", 0, "ok", [], [0, 0, 0], "0-0", 1, ""],
                                                  notices=[["node-expired", "ffff", "runner-2", 1, 2]])),
    "reconcile-page": b"C" + R(tick(to=rid(13))) + b"C" + R(tick()),
    # Issue 19 g and its family.
    "forged-slots-longer-than-members": UP + A(1) + b"C" + R(reply("ok", decision("queued", rid(1))))
    + S("7-1", entry("granted", rid(1), "9", ",".join(str(i) for i in range(200)), "a")),
    "forged-reply-slots-longer": UP + A(1) + b"C" + R(reply("ok", decision("granted", rid(1), 7, [0, 1, 2], ["a"]))),
    "forged-slot-over-limit": UP + A(1) + b"C" + R(reply("ok", decision("queued", rid(1))))
    + S("7-2", entry("granted", rid(1), "9", "3", "a")),
    "forged-token-zero": UP + A(1) + b"C" + R(reply("ok", decision("granted", rid(1), 0, [0], ["a"]))),
    "forged-token-huge": UP + A(1) + b"C" + R(reply("ok", decision("granted", rid(1), 1 << 53, [0], ["a"]))),
    "forged-token-negative": UP + A(1) + b"C" + R(reply("ok", decision("queued", rid(1))))
    + S("7-3", entry("granted", rid(1), "-1", "0", "a")),
    "forged-unknown-member": UP + A(1) + b"C" + R(reply("ok", decision("granted", rid(1), 7, [0], ["z"]))),
    "forged-wrong-member": UP + A(1) + b"C" + R(reply("ok", decision("granted", rid(1), 7, [0], ["b"]))),
    "forged-slot-twice": UP + A(2) + b"C" + R(reply("ok", decision("granted", rid(1), 7, [1, 1], ["b", "b"]))),
    "forged-slot-held": UP + A(1) + b"C" + R(reply("ok", decision("granted", rid(1), 7, [0], ["a"]))) + A(1) + b"C"
    + R(reply("ok", decision("granted", rid(2), 8, [0], ["a"]))),
    "forged-never-sent": UP + S("7-4", entry("granted", rid(99), "9", "0", "a")),
    "forged-other-rid": UP + A(1) + b"C" + R(reply("ok", decision("granted", rid(17), 7, [0], ["a"]))),
    "forged-bad-rid": UP + S("7-5", entry("granted", "../etc/passwd", "9", "0", "a")),
    "forged-bad-id": UP + A(1) + b"C" + R(reply("ok", decision("queued", rid(1))))
    + S("$", entry("granted", rid(1), "9", "0", "a")),
    "forged-odd-fields": UP + S("7-6", ["verdict", "granted", "rid"]),
    "forged-nested-field": UP + S("7-7", ["slots", [[[]]], "rid", rid(1)]),
    "forged-huge-field": UP + A(1) + b"C" + R(reply("ok", decision("queued", rid(1))))
    + S("7-8", entry("granted", rid(1), "9", "x" * 5000, "a")),
    "forged-unknown-verdict": UP + A(1) + b"C" + R(reply("ok", decision("stolen", rid(1), 7, [0], ["a"]))),
    "forged-refusal-unknown": UP + A(1) + b"C" + R(reply("ok", decision("refused", rid(1), refusal="nope"))),
    "wrong-shape-short": UP + A(1) + b"C" + R(["ok", 1]),
    "wrong-shape-status-int": UP + A(1) + b"C" + R([1, 1, [], [], [], []]),
    "wrong-shape-now": UP + A(1) + b"C" + R(["ok", "soon", [], [], [], []]),
    "wrong-shape-string": UP + A(1) + b"C" + R("OK"),
    "wrong-shape-tick": b"C" + R(reply("ok", [1, [], 0, "ok", "keys", "fp", 7, "x", ["to"]])),
    "wrong-stream-last": b"C" + R(reply("ok", [1030000000, "e1", 0, "ok", [], [0, 0, 0], "+", 1, ""],
                                        c=cache(0, "0-0 COUNT 9"))),
    "wrong-reconcile-cursor": b"C" + R(tick(to="zzz")),
    "wrong-status": UP + b"C" + R(reply("ok", [[["ffff", "runner-2", rid(19), "ci", 5, 1, [0, 1, 2], ["a"]]], [], 1])),
    "wrong-positions": UP + A(1) + b"C" + R(reply("ok", decision("queued", rid(1)))) + b"T\x0a" + b"C" + R(tick())
    + R(reply("ok", [decision("granted", rid(15), 13, [1], ["b"])])),
    "wrong-reclaim-verdict": UP + b"C" + R(reply("ok", ["maybe"])),
    "many-values": UP + A(1) + b"C" + R(reply("ok", [[i] for i in range(500)])),
    # Cooldown (issue 23): the cache's rests, a busy refusal with its retry_at, a garbage rest's notice.
    "cache-rests": UP + A(1) + b"C" + R(reply("ok", decision("queued", rid(1)),
                                             c=cache() + ["", ["a", "1005000000", "#1", "1004000000"]])),
    "cache-rests-garbage": UP + A(1) + b"C" + R(reply("ok", decision("queued", rid(1)),
                                                     c=cache() + ["", ["a", "inf", "z", "-5", "b"]])),
    "cache-rests-nested": UP + A(1) + b"C" + R(reply("ok", decision("queued", rid(1)), c=cache() + ["", [[["a"]], 7]])),
    "refused-cooldown": UP + A(1, False) + b"C" + R(reply("ok", decision("refused", rid(1), refusal="busy")[:5]
                                                         + ["cooldown"] + decision("refused", rid(1))[6:] + [1004000000])),
    "refused-cooldown-garbage": UP + A(1, False) + b"C" + R(reply("ok", decision("refused", rid(1), refusal="busy")[:5]
                                                                 + ["cooldown"] + decision("refused", rid(1))[6:]
                                                                 + [-(1 << 62)])),
    "notice-bad-rest": UP + b"T\x0a" + b"C" + R(reply("ok", [1030000000, "e1", 0, "ok", [], [0, 0, 0], "0-0", 1, ""],
                                                     notices=[["bad-rest", "#0"], ["bad-rest"]])),
    # Garbage repaired in the members' lives' keys (brokerd/lua/README, "Members' lives"), well formed or not.
    "notice-bad-key": UP + b"T\x0a" + b"C" + R(reply("ok", [1030000000, "e1", 0, "ok", [], [0, 0, 0], "0-0", 1, ""],
                                                    notices=[["bad-key", "hq", "0000000000000001"], ["bad-key", "rekey"],
                                                             ["bad-key"], ["bad-key", ["x"], 7]])),
}

# A pool that sends batches ('b' first): the answer to one is an array of its operations' replies.
B_UP = b"b" + UP
B_TWO = B_UP + A(1) + A(1) + b"C"
seeds.update({
    "batch-two": B_TWO + R([reply("ok", decision("granted", rid(1), 7, [0], ["a"])),
                            reply("ok", decision("queued", rid(2), position=0))]),
    "batch-settling": B_TWO + R([reply("ok", decision("granted", rid(1), 7, [0], ["a"])), reply("settling", [])])
    + b"C" + R(reply("ok", decision("queued", rid(2), position=0))),
    "batch-release-withdraw": B_TWO + R([reply("ok", decision("granted", rid(1), 7, [0], ["a"])),
                                         reply("ok", decision("queued", rid(2), position=0))])
    + b"L" + b"W" + b"C" + R([reply("ok", ["released"]), reply("ok", ["withdrawn"])]),
    "batch-link-flap": B_TWO + b"D" + b"U" + b"C" + R(tick()) + R([reply("ok", decision("queued", rid(1))),
                                                                  reply("ok", decision("queued", rid(2)))]),
    "batch-error": B_TWO + b"E" + enc(None) + b"C" + b"R-ERR script\r\n",
    "batch-wrong-too-many": B_TWO + R([reply("ok", decision("queued", rid(1)))] * 3),
    "batch-wrong-empty": B_TWO + R([]),
    "batch-wrong-short-ok": B_TWO + R([reply("ok", decision("queued", rid(1)))]),
    "batch-wrong-not-array": B_TWO + R(7),
    "batch-wrong-elements": B_TWO + R([1, "ok"]),
    "batch-wrong-swapped": B_TWO + R([reply("ok", decision("queued", rid(2))), reply("ok", decision("queued", rid(1)))]),
})

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(out, "seed-" + name), "wb") as f:
        f.write(data)
print(len(seeds), "seeds")
