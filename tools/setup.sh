#!/bin/bash
# Installs slotbroker's build dependencies from Debian's packages (as root, when any is missing),
# then configures and compiles into ./build. Used by the README's two commands and by CI.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
        build-essential meson ninja-build pkg-config
        libsystemd-dev libsqlite3-dev libjansson-dev libcmocka-dev libinih-dev
        libhiredis-dev redis-server redis-tools
        scdoc python3 systemd util-linux procps sqlite3
        clang libclang-rt-dev valgrind
        debootstrap zstd
        # The systemd lane's package upgrade (tests/systemd/test-upgrade.sh) builds the .debs: debian/control's
        # Build-Depends beyond the above.
        debhelper dpkg-dev bash-completion pkgconf
        # test-report loads slotctl report's page in a real browser (skipped without it): 122 MB to fetch.
        chromium
        # test-shared-rolling watches the order in which a brokerd writes to Redis and to its client.
        strace
)
missing=()
for p in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
        echo "==> Installing: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -f build/build.ninja ]; then
        # _FORTIFY_SOURCE as Debian's hardening flags build the package: its checks (ignored results of
        # write(), asprintf() …) fail this build too.
        # -Dredis=enabled: pools shared through Redis are part of what is built and tested here.
        meson setup build -Dwerror=true -Dtests=enabled -Dredis=enabled -Dc_args=-D_FORTIFY_SOURCE=2
fi
ninja -C build
