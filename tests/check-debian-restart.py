#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""An upgrade of the Debian package restarts brokerd and leaves brokerd.socket listening throughout
(issue 20 item 5; brokerd(8) RESTART BEHAVIOUR).

What dh_installsystemd (debhelper 13) generates follows from its options in debian/rules:

  brokerd.socket   --no-stop-on-upgrade: no stop in preinst, prerm stops it only on remove, postinst
                   starts it (a no-op while it listens). Never --restart-after-upgrade: a restarted
                   socket refuses the connections that arrive meanwhile, and Requires= would take
                   brokerd.service down with it.
  brokerd.service  --no-start --no-stop-on-upgrade: nothing stops it before the upgrade, and debhelper does
                   not restart it; debian/slotbroker.postinst try-restarts it after an upgrade (the new
                   brokerd serves at once if one ran; if none ran, the next client starts the new one
                   through the socket), and only when the new brokerd's --check-config takes the
                   configuration: a brokerd that refuses it would not start, failing every job, so the
                   old one keeps serving. On remove, the socket's stop takes it down (Requires=brokerd.socket).

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
    if not any(o in svc for o in STOP_BEFORE):
        fail(f"{SERVICE} needs --no-stop-on-upgrade: otherwise it is stopped before the upgrade")
    if "--restart-after-upgrade" in svc or "-R" in svc:
        fail(f"{SERVICE}: debhelper's restart would not check the new brokerd's configuration first")
    with open(os.path.join(root, "debian", "slotbroker.postinst")) as f:
        text = f.read()
    # debhelper replaces every "#DEBHELPER#", in a comment too: its snippets would run twice.
    if text.count("#DEBHELPER#") != 1 or "\n#DEBHELPER#\n" not in text:
        fail("debian/slotbroker.postinst needs one line #DEBHELPER#, and the token nowhere else")
    check_restart(text, "debian/slotbroker.postinst")


def check_restart(text, where):
    """The postinst try-restarts brokerd.service after an upgrade, and only when --check-config passed."""
    restarts = [(a, c) for a, c in invocations_in(text, SERVICE) if a in ("restart", "try-restart")]
    if not restarts:
        fail(f"{where} does not restart {SERVICE} after an upgrade")
    for action, cond in restarts:
        if action != "try-restart":
            fail(f"{where} would {action} {SERVICE}: a try-restart leaves a stopped one to the socket")
        if '[ -n "$2" ]' not in cond:
            fail(f"{where} restarts {SERVICE} on a first installation too (condition: {cond or 'none'})")
        innermost = cond.split(" && if ")[-1]
        if "check_config" not in innermost or "else of" in innermost:
            fail(f"{where} restarts {SERVICE} without the new brokerd's --check-config (condition: {cond})")


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


def invocations_in(text, unit):
    """(action, condition) of every deb-systemd-invoke of unit in a maintainer script's text."""
    out = []
    for line, cond in snippets(text):
        m = re.match(r"deb-systemd-invoke (\S+) (.*?)(?: >/dev/null.*)?$", line)
        if m and unit in shlex.split(m.group(2)):
            out.append((m.group(1), cond))
    return out


def invocations(path, unit):
    """invocations_in() of the script at path ([] without it)."""
    try:
        with open(path) as f:
            return invocations_in(f.read(), unit)
    except FileNotFoundError:
        return []


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
    with open(os.path.join(control, "postinst")) as f:
        check_restart(f.read(), "postinst")
    if any(a in ("stop", "start", "restart") for a, _ in post(SERVICE)):
        fail(f"postinst starts, stops or restarts {SERVICE} unchecked: {post(SERVICE)}")


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    check_rules(sys.argv[1])
    if len(sys.argv) == 3:
        check_scripts(sys.argv[2])
        print(f"check-debian-restart: debian/rules and the scripts in {sys.argv[2]} agree")


if __name__ == "__main__":
    main()
