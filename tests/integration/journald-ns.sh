#!/bin/bash
# SPDX-License-Identifier: MIT
# Runs COMMAND inside private mount and pid namespaces that have a systemd-journald of their own, so
# that what brokerd sends to /run/systemd/journal/socket lands in a throw-away journal the test reads
# with `journalctl -D /run/log/journal`. The machine's /run, /var/log/journal and journald are never
# touched; everything in the namespaces dies with COMMAND.
#
#   journald-ns.sh COMMAND [ARG...]
#
# Inside, $JOURNALD_NS_PID is the private journald's pid (the tests stop and continue it) and
# $JOURNALD_NS_DIRECTORY the directory to give journalctl -D. Exits 77 (meson's SKIP) when it cannot
# run: not root, no /lib/systemd/systemd-journald, or namespaces refused (an unprivileged container).
set -eu

JOURNALD=/lib/systemd/systemd-journald

if [ "${JOURNALD_NS_INNER:-}" != 1 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "journald-ns: needs root for its namespaces; skipping" >&2
        exit 77
    fi
    if [ ! -x "$JOURNALD" ]; then
        echo "journald-ns: $JOURNALD is missing (Debian package systemd); skipping" >&2
        exit 77
    fi
    # Refused without CAP_SYS_ADMIN (an unprivileged container), and in a chroot, whose / is no mount
    # point and so cannot be made private: the tmpfs mounts could reach the parent namespace.
    if ! err=$(unshare --mount --propagation private --pid --fork --mount-proc true 2>&1); then
        echo "journald-ns: cannot create private mount and pid namespaces here (${err//$'\n'/ }); skipping" >&2
        exit 77
    fi
    # --kill-child: if unshare dies (meson's timeout), the namespace's first process and so every
    # process in it dies too.
    exec unshare --mount --propagation private --pid --fork --mount-proc --kill-child \
        env JOURNALD_NS_INNER=1 "$0" "$@"
fi

conf=$(mktemp /tmp/journald-ns.XXXXXX.conf)
trap 'rm -f "$conf"' EXIT
# Volatile storage under /run/log/journal; no rate limit of journald's own (the tests count entries).
printf '%s\n' '[Journal]' Storage=volatile ReadKMsg=no Audit=no ForwardToSyslog=no ForwardToKMsg=no \
    ForwardToWall=no ForwardToConsole=no RateLimitBurst=0 >"$conf"
# tmpfs mounts in this mount namespace only: they hide the machine's directories, never change them.
mount -t tmpfs -o mode=0755 tmpfs /run/systemd
mkdir -p /run/systemd/journal
mkdir -p /run/log 2>/dev/null || true
mount -t tmpfs -o mode=0755 tmpfs /run/log
if [ -d /var/log/journal ]; then
    mount -t tmpfs -o mode=2755 tmpfs /var/log/journal
fi
mount --bind "$conf" /etc/systemd/journald.conf
# NEVER pass an argument to systemd-journald: its argv[1] is taken as a journal namespace's name.
"$JOURNALD" >/dev/null 2>&1 &
journald_pid=$!
for _ in $(seq 200); do
    [ -S /run/systemd/journal/socket ] && break
    sleep 0.05
done
if [ ! -S /run/systemd/journal/socket ]; then
    echo "journald-ns: the private journald did not start" >&2
    exit 1
fi
export JOURNALD_NS_PID=$journald_pid
export JOURNALD_NS_DIRECTORY=/run/log/journal
rc=0
"$@" || rc=$?
# journald would be killed with the namespace anyway; a clean stop lets it close its files.
kill "$journald_pid" 2>/dev/null || true
exit $rc
