#!/bin/bash
# The whole test suite: unit tests, integration tests against the real brokerd, fuzz corpora replay, the
# units under a real systemd, then everything but the systemd lane and the long fault runs (suite "slow":
# shared pools under seeded faults, Sentinel failovers) again with AddressSanitizer and
# UndefinedBehaviorSanitizer (clang: brokerd itself runs sanitized under the integration tests), and the
# unit tests under valgrind. The summary gives each stage's time: CI allows 15 minutes on 2 cores.
#
# What cannot run where it runs (no root, no namespaces without CAP_SYS_ADMIN, a tool missing) is
# skipped, never failed: the summary at the end names each stage's outcome and every skipped test and
# case with its reason (tools/test-skips.py). tools/test-unprivileged.sh runs this as in a container.
set -euo pipefail
cd "$(dirname "$0")/.."

stages=()   # each stage's outcome, with what it skipped, for the summary
current=""
summary() {
        local rc=$?
        [ -z "$current" ] || stages+=("$current: FAILED (exit $rc)")
        echo
        echo "==> summary (uid $(id -u), CapEff $(awk '/^CapEff/ { print $2 }' /proc/self/status))"
        local s
        for s in "${stages[@]}"; do echo "    $s"; done
}
trap summary EXIT

# stage NAME BUILD_DIR COMMAND…: runs a `meson test` stage and records its outcome, its time and what it
# skipped.
stage() {
        local name=$1 dir=$2 skipped rc=0 start=$SECONDS
        shift 2
        echo "==> $name"
        current=$name
        "$@"
        current=""
        skipped=$(python3 tools/test-skips.py "$dir" | sed 's/^/        /') || rc=$?
        if [ $rc = 77 ]; then
                outcome="SKIPPED (every test)"
        elif [ -n "$skipped" ]; then
                outcome="ran, $(wc -l <<<"$skipped") skipped"
        else
                outcome=ran
        fi
        stages+=("$name: $outcome in $((SECONDS - start)) s${skipped:+$'\n'$skipped}")
}

current="setup (tools/setup.sh)"
bash tools/setup.sh
stages+=("$current: done in $SECONDS s")
current=""

stage "meson test (gcc, -Werror)" build \
        meson test -C build --print-errorlogs --no-suite systemd

# Skipped without root, namespaces (CAP_SYS_ADMIN) or the Debian mirror.
stage "the units under a real systemd (a booted Debian 12 root)" build \
        meson test -C build --print-errorlogs --suite systemd

echo "==> building with ASan/UBSan (clang)"
current="ASan/UBSan build"
if [ ! -f build-asan/build.ninja ]; then
        CC=clang meson setup build-asan -Dwerror=true -Dtests=enabled -Dredis=enabled -Db_sanitize=address,undefined -Db_lundef=false
fi
ninja -C build-asan
current=""
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        stage "meson test under ASan/UBSan (clang)" build-asan \
        meson test -C build-asan --print-errorlogs --suite unit --suite fuzz --suite integration --no-suite slow

# Ten times the timeouts: valgrind runs the history writer's 200,000 rows some twenty times slower.
# no-valgrind: what valgrind cannot run (a clone() sharing memory; see tests/meson.build).
stage "unit tests under valgrind" build \
        meson test -C build --print-errorlogs --suite unit --no-suite no-valgrind --timeout-multiplier 10 \
        --wrap='valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite --fair-sched=yes -q'
