#!/bin/bash
# test-systemd.sh — slotbroker under a real systemd: a Debian 12 root (container.sh) with the project
# installed as a package would install it, booted with systemd as PID 1 of its own namespaces.
#
#   test-systemd.sh SOURCE_ROOT WORK_DIR
#
# WORK_DIR keeps a build with --prefix=/usr (incremental across runs) and the container's root
# (removed at the end); the debootstrapped root is cached by container.sh outside the source tree.
# SLOTBROKER_LANE_DEBS=DIR installs the .debs of DIR (dpkg-buildpackage's output) with dpkg inside
# the booted container instead, so that the maintainer scripts run against a live systemd.
# SLOTBROKER_LANE_KEEP=1 leaves a failed run's container running, for a look inside.
# Exit 77 (skip) when not root, without namespaces (no CAP_SYS_ADMIN), when a tool is missing, or when
# the Debian mirror cannot be reached for the first build of the root.
set -euo pipefail
src=$(realpath "${1:?SOURCE_ROOT missing}")
work=$(realpath -m "${2:?WORK_DIR missing}")
here=$(dirname "$(realpath "$0")")
ct=$here/container.sh
root=$work/root
build=$work/build
t0=$(date +%s)

log() { echo "[$(($(date +%s) - t0))s] $*"; }
skip() { echo "SKIP: $*"; exit 77; }

[ "$(id -u)" = 0 ] || skip "needs root (debootstrap, namespaces, cgroups)"
for tool in unshare nsenter chroot meson ninja python3; do
        command -v "$tool" >/dev/null || skip "$tool not found"
done
grep -qw cgroup2 /proc/filesystems || skip "the kernel has no cgroup2"
# Refused without CAP_SYS_ADMIN (an unprivileged container is root without it), and in a chroot, whose /
# is no mount point and so cannot be made private: the container's mounts could reach the parent namespace.
err=$(unshare --mount --propagation private --pid --fork --cgroup --uts --ipc --net true 2>&1) ||
        skip "cannot create the container's private mount, pid, cgroup, uts, ipc and net namespaces here (${err//$'\n'/ })"
[ -f /sys/fs/cgroup/cgroup.procs ] || [ -f /sys/fs/cgroup/unified/cgroup.procs ] ||
        skip "no cgroup2 hierarchy at /sys/fs/cgroup (is /sys mounted?)"

# ---- helpers ----

holders=()
cleanup() {
        local rc=$?
        trap - EXIT
        if [ $rc != 0 ] && [ $rc != 77 ] && [ -f "$root.state/pid" ]; then
                echo "---- diagnostics ----"
                cx systemctl --no-pager status brokerd.socket brokerd.service 2>&1 | tail -n 30 || true
                cx journalctl --no-pager -n 60 -u brokerd.service -u brokerd.socket -u slotbroker-nightly.service 2>&1 || true
        fi
        if [ $rc != 0 ] && [ $rc != 77 ] && [ -n "${SLOTBROKER_LANE_KEEP:-}" ]; then
                echo "SLOTBROKER_LANE_KEEP: the container still runs; look inside with"
                echo "  $ct exec $root bash"
                echo "and end it with: $ct stop $root"
                exit $rc
        fi
        "$ct" stop "$root" >/dev/null 2>&1 || true
        # The holders' commands died with the container's pid namespace; their nsenter go with them.
        for p in "${holders[@]}"; do kill "$p" 2>/dev/null || true; done
        rm -rf "$root" "$root.state"
        log "cleaned up"
        exit $rc
}
trap cleanup EXIT

# Inside the container, with a clean environment: nothing of the host's (SLOTBROKER_SOCKET…) leaks in.
cx() { "$ct" exec "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }

fail() {
        echo "FAIL: $*"
        exit 1
}
ok() { log "ok: $*"; }

# wait_for SECONDS DESCRIPTION CMD…: poll CMD until it succeeds.
wait_for() {
        local secs=$1 what=$2
        shift 2
        local deadline=$(($(date +%s) + secs))
        until "$@" >/dev/null 2>&1; do
                [ "$(date +%s)" -lt "$deadline" ] || fail "timed out after ${secs}s waiting for: $what"
                sleep 0.2
        done
}

is_active() { [ "$(cx systemctl is-active "$1" 2>/dev/null || true)" = "$2" ]; }
status_json() { cx slotctl status --json; }
status_has() { status_json | grep -q -- "$1"; }
lease_of_job() {
        status_json | python3 -c '
import json, sys
for h in json.load(sys.stdin)["holders"]:
    if h["lease"].get("job") == sys.argv[1]:
        print(h["lease"]["id"], h["lease"]["uid"], h["lease"].get("commandPid", 0))' "$1"
}
in_use() { status_json | python3 -c 'import json, sys; print(sum(p["inUse"] for p in json.load(sys.stdin)["pools"]))'; }

# ---- build and install, as a package would ----

debs=${SLOTBROKER_LANE_DEBS:-}
if [ -z "$debs" ]; then
        log "building with --prefix=/usr in $build"
        if [ ! -f "$build/build.ninja" ]; then
                meson setup "$build" "$src" --prefix=/usr --sysconfdir=/etc --localstatedir=/var \
                        -Dtests=disabled -Dman=disabled -Dsystemd=enabled >"$work.setup.log" 2>&1 ||
                        { cat "$work.setup.log"; fail "meson setup"; }
        fi
        ninja -C "$build" >"$work.ninja.log" 2>&1 || { tail -n 30 "$work.ninja.log"; fail "build"; }
fi

log "unpacking the Debian 12 root"
rc=0
"$ct" build "$root" || rc=$?
[ $rc = 77 ] && skip "no Debian 12 root: debootstrap could not reach the mirror"
[ $rc = 0 ] || fail "container.sh build"

if [ -z "$debs" ]; then
        meson install -C "$build" --destdir "$root" --no-rebuild --quiet >"$work.install.log" 2>&1 ||
                { cat "$work.install.log"; fail "meson install"; }
        chroot "$root" ldconfig
        # What the package's maintainer scripts and dpkg triggers do; tmpfiles.d is left to the boot.
        systemd-sysusers --root="$root" >/dev/null
        systemctl --root="$root" enable brokerd.socket >/dev/null 2>&1
        journalctl --root="$root" --update-catalog
else
        mkdir -p "$root/root/debs"
        cp "$debs"/slotbroker_*.deb "$debs"/libbroker1_*.deb "$debs"/libbroker-dev_*.deb "$root/root/debs/"
fi
# A CI user, in the group that may connect (made by the package's sysusers.d).
add_tester() { chroot "$root" useradd --create-home --groups slotbroker --shell /bin/sh tester; }
[ -n "$debs" ] || add_tester

mkdir -p "$root/etc/brokerd"
cat >"$root/etc/brokerd/brokerd.conf" <<'EOF'
[broker]
audit = all

[pool ci]
limit = 2
queue-timeout = 5min

[lane merge]
pools = ci
policy = fail-fast

[lane nightly]
pools = ci
policy = wait
EOF

# The example nightly sweep, as documented: its units copied to /etc (after the installation), the
# timer brought forward to "one second after it starts" by a drop-in.
install_examples() {
        local examples=$root/usr/share/doc/slotbroker/examples
        cp "$examples/slotbroker-nightly.service" "$examples/slotbroker-nightly.timer" "$root/etc/systemd/system/"
}
[ -n "$debs" ] || install_examples
mkdir -p "$root/etc/systemd/system/slotbroker-nightly.timer.d"
cat >"$root/etc/systemd/system/slotbroker-nightly.timer.d/soon.conf" <<'EOF'
[Timer]
OnCalendar=
OnActiveSec=1s
AccuracySec=100ms
RandomizedDelaySec=0
Persistent=false
EOF
cat >"$root/usr/local/bin/nightly-sweep" <<'EOF'
#!/bin/sh
echo "nightly-sweep: slot $SLOT_INDEX of pool $SLOT_POOL, lane $SLOT_LANE, token $SLOT_TOKEN, uid $(id -u)"
EOF
chmod 0755 "$root/usr/local/bin/nightly-sweep"

# ---- boot ----

log "booting"
"$ct" boot "$root" >/dev/null || fail "the container did not boot (see $root.state/console.log)"
ok "systemd runs as PID 1 of the container"

if [ -n "$debs" ]; then
        cx sh -c 'dpkg -i /root/debs/*.deb' >"$work.dpkg.log" 2>&1 || { cat "$work.dpkg.log"; fail "dpkg -i"; }
        install_examples
        add_tester
        cx systemctl daemon-reload
        cx journalctl --update-catalog   # systemd's dpkg trigger does this too; triggers may be deferred
        ok "dpkg -i $(cd "$root/root/debs" && echo *.deb)"
fi

# 0. The installed units, as this systemd reads them: systemd-analyze verify prints nothing. (No man
# pages in the root: --man=no.)
out=$(cx systemd-analyze verify --man=no brokerd.socket brokerd.service \
        slotbroker-nightly.timer slotbroker-nightly.service 2>&1) || true
[ -z "$out" ] || fail "systemd-analyze verify on the installed units: $out"
ok "systemd-analyze verify on the installed units prints nothing"

# 1. The socket listens before brokerd runs.
is_active brokerd.socket active || fail "brokerd.socket is not active after boot"
is_active brokerd.service inactive || fail "brokerd.service runs before any client connected"
[ "$(cx stat -c '%U:%G %a %F' /run/brokerd/io.slotbroker)" = "root:slotbroker 660 socket" ] ||
        fail "socket file: $(cx stat -c '%U:%G %a %F' /run/brokerd/io.slotbroker)"
[ "$(cx stat -c '%U:%G %a' /run/brokerd)" = "slotbroker:slotbroker 755" ] ||
        fail "/run/brokerd: $(cx stat -c '%U:%G %a' /run/brokerd)"
ok "brokerd.socket listens (root:slotbroker 0660), brokerd.service inactive"

# 2. The first connection starts brokerd, which reaches READY under the hardened unit.
cx slotctl status >/dev/null || fail "slotctl status through the socket"
is_active brokerd.service active || fail "brokerd.service did not become active"
pid=$(cx systemctl show -p MainPID --value brokerd.service)
[ "$(cx ps -o user= -p "$pid" | tr -d ' ')" = slotbroker ] || fail "brokerd does not run as slotbroker"
# No capability at all (see the unit): not even in the bounding set.
caps=$(cx grep -E '^Cap(Prm|Eff|Bnd|Amb):' "/proc/$pid/status" | awk '{ print $2 }' | sort -u | tr '\n' ' ')
[ "$caps" = "0000000000000000 " ] || fail "brokerd has capabilities: $(cx grep ^Cap "/proc/$pid/status" | tr '\n' ' ')"
[ "$(cx systemctl show -p WatchdogUSec --value brokerd.service)" = 30s ] || fail "no watchdog"
cx systemctl show -p StatusText --value brokerd.service | grep -q "ci 0/2 in use" ||
        fail "STATUS=: $(cx systemctl show -p StatusText --value brokerd.service)"
ok "the first client started brokerd: active, user slotbroker, no capabilities, watchdog 30s, STATUS=$(cx systemctl show -p StatusText --value brokerd.service)"
cx systemd-analyze security brokerd.service 2>/dev/null | tail -n 1 | sed 's/^/    /' || true

# 3. A lease taken by a command of another user.
tester_uid=$(cx id -u tester)
"$ct" exec "$root" /usr/bin/env -i PATH=/usr/bin:/bin /usr/sbin/runuser -u tester -- \
        slotctl run --lane nightly --job tester-hold -- sleep 600 >"$work.tester.log" 2>&1 &
holders+=($!)
disown
wait_for 10 "the tester's lease in Status" status_has '"job":"tester-hold"'
read -r tester_lease uid tester_cmd < <(lease_of_job tester-hold)
[ "$uid" = "$tester_uid" ] || fail "the lease has uid $uid, not the tester's $tester_uid"
[ "$tester_cmd" != 0 ] || fail "no command pid attached to the tester's lease"
ok "uid $tester_uid holds lease $tester_lease (command pid $tester_cmd)"

# 4. systemctl reload applies a new lane without dropping the held lease; a bad file is rejected.
rc=0
cx slotctl run --lane extra --no-wait -- true 2>/dev/null || rc=$?
[ $rc = 64 ] || fail "lane extra before the reload: exit $rc, expected 64 (unknown lane)"
cat >>"$root/etc/brokerd/brokerd.conf" <<'EOF'

[lane extra]
pools = ci
policy = fail-fast
EOF
cx systemctl reload brokerd.service || fail "systemctl reload brokerd"
cx slotctl run --lane extra --no-wait --job extra-1 -- true || fail "lane extra after the reload"
[ "$(lease_of_job tester-hold | cut -d' ' -f1)" = "$tester_lease" ] || fail "the reload dropped the tester's lease"
cp "$root/etc/brokerd/brokerd.conf" "$work.conf.good"
printf '\n[lane broken]\npools = nosuchpool\n' >>"$root/etc/brokerd/brokerd.conf"
if cx systemctl reload brokerd.service 2>/dev/null; then fail "a reload of an invalid configuration succeeded"; fi
is_active brokerd.service active || fail "brokerd is not active after a rejected reload"
cx slotctl run --lane extra --no-wait -- true || fail "the old configuration did not stay after a rejected reload"
cp "$work.conf.good" "$root/etc/brokerd/brokerd.conf"
cx journalctl -u brokerd.service --no-pager -o cat SLOT_RELOAD=rejected | grep -q CONFIG_REJECTED ||
        fail "no CONFIG_REJECTED entry in the journal"
ok "systemctl reload applied lane extra, kept lease $tester_lease, and rejected a bad file (the old configuration stayed)"

# 5. The nightly timer fires; its job gets a slot.
cx systemctl start slotbroker-nightly.timer
wait_for 30 "the nightly sweep's output" \
        sh -c "'$ct' exec '$root' journalctl -u slotbroker-nightly.service --no-pager -o cat | grep -q 'nightly-sweep: slot'"
wait_for 10 "the nightly sweep to finish" is_active slotbroker-nightly.service inactive
result=$(cx systemctl show -p Result --value slotbroker-nightly.service)
[ "$result" = success ] || fail "slotbroker-nightly.service: $result"
wait_for 10 "the nightly sweep's grant in the history" \
        sh -c "'$ct' exec '$root' slotctl history --json --decision=granted --lane nightly | grep -q '\"job\": *\"nightly-sweep\"'"
ok "the timer ran slotbroker-nightly.service: $(cx journalctl -u slotbroker-nightly.service --no-pager -o cat | grep 'nightly-sweep: slot')"

# 6. A refusal, audited with its SLOT_* fields.
cx slotctl run --lane nightly --job filler -- sleep 600 >"$work.filler.log" 2>&1 &
holders+=($!)
disown
wait_for 10 "the filler's lease" status_has '"job":"filler"'
rc=0
cx slotctl run --lane merge --job merge-refused --quiet -- true 2>/dev/null || rc=$?
[ $rc = 75 ] || fail "merge with a full pool: exit $rc, expected 75"
wait_for 10 "the busy entry in the journal" \
        sh -c "'$ct' exec '$root' journalctl -u brokerd SLOT_DECISION=busy --no-pager -o json | grep -q merge-refused"
cx journalctl -u brokerd SLOT_DECISION=busy --no-pager -o json | python3 -c '
import json, sys
e = [json.loads(l) for l in sys.stdin if "merge-refused" in l][-1]
want = {"SLOT_DECISION": "busy", "SLOT_POOL": "ci", "SLOT_LANE": "merge", "SLOT_JOB": "merge-refused",
        "SLOT_CLIENT_UID": "0", "MESSAGE_ID": "a1a991c3c12e4d2cb5c56b054695c258", "_SYSTEMD_UNIT": "brokerd.service"}
bad = {k: e.get(k) for k, v in want.items() if e.get(k) != v}
assert not bad, bad
assert e["MESSAGE"].startswith("[QUEUE_BUSY]"), e["MESSAGE"]
assert int(e["SLOT_RETRY_AFTER_SEC"]) >= 1 and int(e["SLOT_CLIENT_PID"]) > 0, e
print("    " + " ".join(f"{k}={e[k]}" for k in sorted(e) if k.startswith("SLOT_")))
print("    MESSAGE=" + e["MESSAGE"])' || fail "the busy entry lacks its fields"
[ "$(in_use)" = 2 ] || fail "the pool is not full: $(in_use) in use"
cx journalctl --no-pager -x -u brokerd SLOT_DECISION=busy -n 1 | grep -q "designed behaviour of a fail-fast lane" ||
        fail "journalctl -x does not show the catalog entry of the busy refusal"
ok "journalctl -u brokerd SLOT_DECISION=busy shows the refusal with its SLOT_* fields, and -x its catalog text"

# 7. systemctl restart keeps the leases whose commands still run, and their slots.
cx systemctl restart brokerd.service || fail "systemctl restart brokerd"
is_active brokerd.service active || fail "brokerd not active after restart"
[ "$(lease_of_job tester-hold | cut -d' ' -f1)" = "$tester_lease" ] || fail "the tester's lease did not survive the restart"
status_has '"job":"filler"' || fail "the filler's lease did not survive the restart"
cx kill -0 "$tester_cmd" || fail "the tester's command died in the restart"
rc=0
cx slotctl run --lane merge --job merge-after-restart --quiet -- true 2>/dev/null || rc=$?
[ $rc = 75 ] || fail "a restored lease's slot was granted to another (exit $rc, expected 75)"
cx journalctl -u brokerd --no-pager -o cat SLOT_DECISION=restored | grep -q "$tester_lease" ||
        fail "no 'restored' journal entry for $tester_lease"
ok "after systemctl restart: lease $tester_lease restored, its command runs, its slot not granted to another"

# 8. A stopped brokerd is started again by the next client: the socket file survives. The slotctl processes
# holding leases reconnect at once to reclaim them, so that next client may be one of them rather than us.
old_pid=$(cx systemctl show -p MainPID --value brokerd.service)
cx systemctl stop brokerd.service 2>/dev/null   # "can still be activated by brokerd.socket": that is the point
is_active brokerd.socket active || fail "brokerd.socket stopped with the service"
cx test -S /run/brokerd/io.slotbroker || fail "the socket file is gone after stopping the service"
status_has '"job":"tester-hold"' || fail "the next client did not get brokerd back with the tester's lease"
is_active brokerd.service active || fail "brokerd.service was not started again by a client"
[ "$(cx systemctl show -p MainPID --value brokerd.service)" != "$old_pid" ] || fail "brokerd was not stopped"
ok "after systemctl stop brokerd, the socket stayed and the next client started brokerd again (lease still there)"

# 9. Stopping both leaves no brokerd behind.
cx systemctl stop brokerd.socket brokerd.service
is_active brokerd.service inactive && is_active brokerd.socket inactive || fail "units still active after stop"
if cx pgrep -x brokerd >/dev/null; then fail "a brokerd process is left: $(cx pgrep -a -x brokerd)"; fi
ok "systemctl stop brokerd.socket brokerd.service leaves no brokerd process"

log "PASS: all checks"
