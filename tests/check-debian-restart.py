#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""An upgrade of the Debian package restarts brokerd and leaves brokerd.socket listening throughout
(issue 20 item 5; brokerd(8) RESTART BEHAVIOUR).

What dh_installsystemd (debhelper 13) generates follows from its options in debian/rules:

  brokerd.socket   --no-stop-on-upgrade: no stop in preinst, prerm stops it only on remove, postinst
                   starts it (a no-op while it listens). Never --restart-after-upgrade: a restarted
                   socket refuses the connections that arrive meanwhile, and Requires= would take
                   brokerd.service down with it.
  brokerd.service  --no-start --restart-after-upgrade: postinst try-restarts it after an upgrade (the new
                   brokerd serves at once if one ran; if none ran, the next client starts the new one
                   through the socket); nothing stops it before the upgrade. On remove, the socket's stop
                   takes it down (Requires=brokerd.socket).

Always checks debian/rules' override; given the built package's control directory
(debian/slotbroker/DEBIAN after dpkg-buildpackage), checks the generated preinst, postinst and prerm too.

Usage: check-debian-restart.py SOURCE_ROOT [DEBIAN_CONTROL_DIR]
"""
import os
import re
import shlex
import sys

SOCKET, SERVICE = "brokerd.socket", "brokerd.service"
STOP_BEFORE = ("--no-stop-on-upgrade", "--no-restart-on-upgrade", "-r")


def fail(message):
    sys.exit(f"check-debian-restart: {message}")


def installsystemd_calls(rules):
    """{unit: [options]} of the dh_installsystemd lines in override_dh_installsystemd."""
    m = re.search(r"^override_dh_installsystemd:\n((?:\t.*\n)+)", rules, re.M)
    if not m:
        fail("debian/rules has no override_dh_installsystemd")
    calls = {}
    for line in m.group(1).splitlines():
        argv = shlex.split(line.strip())
        if not argv or argv[0] != "dh_installsystemd":
            continue
        units = [a for a in argv[1:] if not a.startswith("-")]
        for u in units:
            calls[u] = [a for a in argv[1:] if a.startswith("-")]
    for u in (SOCKET, SERVICE):
        if u not in calls:
            fail(f"debian/rules: no dh_installsystemd line names {u}")
    return calls


def check_rules(root):
    with open(os.path.join(root, "debian", "rules")) as f:
        calls = installsystemd_calls(f.read())
    sock, svc = calls[SOCKET], calls[SERVICE]
    if not any(o in sock for o in STOP_BEFORE):
        fail(f"{SOCKET} needs --no-stop-on-upgrade: otherwise it is stopped before the upgrade")
    if "--restart-after-upgrade" in sock or "-R" in sock:
        fail(f"{SOCKET} must not be restarted after an upgrade")
    if "--restart-after-upgrade" not in svc and "-R" not in svc:
        fail(f"{SERVICE} needs --restart-after-upgrade (with --no-start, debhelper would not restart it)")
    for o in STOP_BEFORE + ("--no-restart-after-upgrade",):
        if o in svc:
            fail(f"{SERVICE}: {o} would leave the old brokerd running after an upgrade")


def snippets(text):
    """The shell lines of a maintainer script, each with the conditions of the `if` blocks around it."""
    out, conds = [], []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("if "):
            conds.append(s)
        elif s == "fi":
            conds.pop()
        elif s.startswith("else"):
            conds[-1] = "else of " + conds[-1]
        else:
            out.append((s, " && ".join(conds)))
    return out


def invocations(path, unit):
    """(action, condition) of every deb-systemd-invoke of unit in the script at path ([] without it)."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return []
    out = []
    for line, cond in snippets(text):
        m = re.match(r"deb-systemd-invoke (\S+) (.*?)(?: >/dev/null.*)?$", line)
        if m and unit in shlex.split(m.group(2)):
            out.append((m.group(1), cond))
    return out


def check_scripts(control):
    pre = lambda u: invocations(os.path.join(control, "preinst"), u)  # noqa: E731
    post = lambda u: invocations(os.path.join(control, "postinst"), u)  # noqa: E731
    prerm = lambda u: invocations(os.path.join(control, "prerm"), u)  # noqa: E731
    for u in (SOCKET, SERVICE):
        if pre(u):
            fail(f"preinst acts on {u} before the upgrade: {pre(u)}")
        for action, cond in prerm(u):
            if action in ("stop", "restart") and '"$1" = remove' not in cond:
                fail(f"prerm would {action} {u} on an upgrade too (condition: {cond or 'none'})")
    for action, cond in post(SOCKET):
        if action != "start":
            fail(f"postinst would {action} {SOCKET}")
    restarts = [(a, c) for a, c in post(SERVICE) if a in ("restart", "try-restart")]
    if not any('[ -n "$2" ]' in c for _, c in restarts):
        fail(f"postinst does not restart {SERVICE} after an upgrade: {post(SERVICE)}")
    if any(a in ("stop", "start") for a, _ in post(SERVICE)):
        fail(f"postinst starts or stops {SERVICE}: {post(SERVICE)}")


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    check_rules(sys.argv[1])
    if len(sys.argv) == 3:
        check_scripts(sys.argv[2])
        print(f"check-debian-restart: debian/rules and the scripts in {sys.argv[2]} agree")


if __name__ == "__main__":
    main()
