#!/bin/bash
# test-upgrade.sh — the systemd lane on the Debian package (issue 20, items 5 and 6): builds the .debs
# from a copy of the source tree (dpkg-buildpackage -b, nocheck), checks the maintainer scripts
# dh_installsystemd generated (tests/check-debian-restart.py), then runs test-systemd.sh with
# SLOTBROKER_LANE_DEBS: the packages are installed with dpkg in the booted container, and its phase 10
# upgrades them twice (dpkg -i at a higher version) under 2 holders and 53 waiters, with a client
# connecting all along.
#
#   test-upgrade.sh SOURCE_ROOT WORK_DIR
#
# A meson test of its own (suite 'systemd'): building the package takes minutes, more than the lane's
# budget. SLOTBROKER_LANE_DEBS=DIR skips the build and uses the .debs of DIR.
# Exit 77 (skip) as test-systemd.sh, or without dpkg-buildpackage/dpkg-deb.
set -euo pipefail
src=$(realpath "${1:?SOURCE_ROOT missing}")
work=$(realpath -m "${2:?WORK_DIR missing}")
here=$(dirname "$(realpath "$0")")

skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (dpkg-buildpackage's fakeroot aside: the lane needs namespaces)"
for tool in dpkg-buildpackage dpkg-deb tar; do
        command -v "$tool" >/dev/null || skip "$tool not found"
done

# The lane's own checks first, before minutes of dpkg-buildpackage for a lane that would skip anyway.
err=$(unshare --mount --propagation private --pid --fork --cgroup --uts --ipc --net true 2>&1) ||
        skip "cannot create the container's private mount, pid, cgroup, uts, ipc and net namespaces here (${err//$'\n'/ })"
if [ -z "${SLOTBROKER_LANE_DEBS:-}" ]; then
        pkg=$work/pkg
        rm -rf "$pkg"
        mkdir -p "$pkg/slotbroker"
        # A copy without build directories or git metadata: dpkg-buildpackage writes into debian/ and ../.
        # tools/test.sh runs this beside the ASan/UBSan build, which may create build-asan/ in the tree while
        # tar reads it: "file changed as we read it" (exit 1) is about the excluded directories, not a fault.
        st=(0 0)
        tar -C "$src" --exclude=./build --exclude='./build-*' --exclude=./.git --warning=no-file-changed -cf - . |
                tar -C "$pkg/slotbroker" -xf - || st=("${PIPESTATUS[@]}")
        if [ "${st[0]}" -gt 1 ] || [ "${st[1]}" -ne 0 ]; then
                echo "FAIL: copying the source tree (tar exited ${st[0]}, then ${st[1]})"
                exit 1
        fi
        echo "building the packages in $pkg"
        if ! (cd "$pkg/slotbroker" && DEB_BUILD_OPTIONS="nocheck parallel=$(nproc)" dpkg-buildpackage -us -uc -b) \
                >"$pkg/build.log" 2>&1; then
                tail -n 40 "$pkg/build.log"
                if grep -q "Unmet build dependencies" "$pkg/build.log"; then skip "build dependencies missing"; fi
                echo "FAIL: dpkg-buildpackage"
                exit 1
        fi
        python3 "$src/tests/check-debian-restart.py" "$src" "$pkg/slotbroker/debian/slotbroker/DEBIAN"
        export SLOTBROKER_LANE_DEBS=$pkg
fi
exec "$here/test-systemd.sh" "$src" "$work/lane"
