#!/bin/bash
# The whole test suite: unit tests, integration tests against the real brokerd, fuzz corpora replay, the
# units under a real systemd, then everything but the systemd lane again with AddressSanitizer and
# UndefinedBehaviorSanitizer (clang: brokerd itself runs sanitized under the integration tests), and the
# unit tests under valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh

echo "==> meson test (gcc, -Werror)"
meson test -C build --print-errorlogs --no-suite systemd

echo "==> the units under a real systemd (a booted Debian 12 root; skipped without root or the Debian mirror)"
meson test -C build --print-errorlogs --suite systemd

echo "==> meson test under ASan/UBSan (clang)"
if [ ! -f build-asan/build.ninja ]; then
        CC=clang meson setup build-asan -Dwerror=true -Dtests=enabled -Db_sanitize=address,undefined -Db_lundef=false
fi
ninja -C build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        meson test -C build-asan --print-errorlogs --suite unit --suite fuzz --suite integration

echo "==> unit tests under valgrind"
# Ten times the timeouts: valgrind runs the history writer's 200,000 rows some twenty times slower.
# no-valgrind: what valgrind cannot run (a clone() sharing memory; see tests/meson.build).
meson test -C build --print-errorlogs --suite unit --no-suite no-valgrind --timeout-multiplier 10 \
        --wrap='valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite --fair-sched=yes -q'
