#!/bin/bash
# verify-units.sh — `systemd-analyze verify` on slotbroker's units, as meson generated them, with no
# booted systemd: any output at all is a failure (verify only warns, exit 0, on unknown keys and bad
# values). The units name the installed binaries; a test copy points them at the build tree instead.
#
#   verify-units.sh UNITS_SOURCE_DIR UNITS_BUILD_DIR SBINDIR BINDIR BROKERD SLOTCTL
#
# verify writes under /run: it runs in a private mount namespace with a tmpfs there (needs root; skips
# with 77 otherwise).
set -euo pipefail
src=$1 build=$2 sbindir=$3 bindir=$4 brokerd=$5 slotctl=$6

if [ "${VERIFY_UNITS_INNER:-}" != 1 ]; then
        command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze not found"; exit 77; }
        # Refused without CAP_SYS_ADMIN, and in a chroot, whose / is no mount point and so cannot be
        # made private.
        if [ "$(id -u)" != 0 ] || ! err=$(unshare -m --propagation private true 2>&1); then
                echo "SKIP: needs root and a private mount namespace (systemd-analyze verify writes under /run)${err:+: ${err//$'\n'/ }}"
                exit 77
        fi
        exec unshare -m --propagation private env VERIFY_UNITS_INNER=1 "$0" "$@"
fi
mount -t tmpfs -o mode=0755 tmpfs /run

t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
mkdir -p "$t/system" "$t/user" "$t/examples"
sweep=$t/nightly-sweep
printf '#!/bin/sh\nexit 0\n' >"$sweep"
chmod +x "$sweep"
rewrite() {
        sed -e "s|$sbindir/brokerd|$brokerd|g" -e "s|$bindir/slotctl|$slotctl|g" \
            -e "s|/usr/bin/slotctl|$slotctl|g" -e "s|/usr/local/bin/nightly-sweep|$sweep|g" "$1" >"$2"
}
rewrite "$src/brokerd.socket" "$t/system/brokerd.socket"
rewrite "$build/brokerd.service" "$t/system/brokerd.service"
rewrite "$src/user/brokerd.socket" "$t/user/brokerd.socket"
rewrite "$build/brokerd-user.service" "$t/user/brokerd.service"
rewrite "$src/examples/slotbroker-nightly.service" "$t/examples/slotbroker-nightly.service"
rewrite "$src/examples/slotbroker-nightly.timer" "$t/examples/slotbroker-nightly.timer"
# The Redis drop-in, applied to the system service.
mkdir -p "$t/redis"
cp "$t/system/brokerd.socket" "$t/system/brokerd.service" "$t/redis/"
mkdir -p "$t/redis/brokerd.service.d"
cp "$src/brokerd.service.d/redis.conf" "$t/redis/brokerd.service.d/"

status=0
check() {
        local what=$1
        shift
        local out rc=0
        out=$(cd "$t" && "$@" 2>&1) || rc=$?
        if [ -n "$out" ] || [ $rc != 0 ]; then
                echo "FAIL: $what (exit $rc):"
                printf '%s\n' "$out" | sed 's/^/    /'
                status=1
        else
                echo "ok: $what"
        fi
}
check "system units" systemd-analyze verify --man=no system/brokerd.socket system/brokerd.service
check "examples" systemd-analyze verify --man=no examples/slotbroker-nightly.timer examples/slotbroker-nightly.service
check "redis drop-in" systemd-analyze verify --man=no redis/brokerd.service
export XDG_RUNTIME_DIR=$t/xdg
mkdir -p -m 0700 "$XDG_RUNTIME_DIR"
check "user units" systemd-analyze verify --user --man=no user/brokerd.socket user/brokerd.service

# sysusers.d and tmpfiles.d: applied to an empty root, where they must work without a complaint.
mkdir -p "$t/root/etc"
quiet_sysusers() { systemd-sysusers --root="$t/root" "$@" 2>&1 | grep -v -E "^Creating (group|user) 'slotbroker'" || true; }
check "sysusers.d" quiet_sysusers "$src/slotbroker.sysusers"
check "tmpfiles.d" systemd-tmpfiles --root="$t/root" --create "$src/brokerd.tmpfiles"
sb_uid=$(awk -F: '$1 == "slotbroker" { print $3 ":" $4 }' "$t/root/etc/passwd")
[ -n "$sb_uid" ] && [ "$(stat -c %u:%g:%a "$t/root/run/brokerd" 2>/dev/null)" = "$sb_uid:755" ] ||
        { echo "FAIL: tmpfiles.d did not make /run/brokerd slotbroker:slotbroker 0755"; status=1; }
exit $status
