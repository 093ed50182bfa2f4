#!/bin/bash
# The whole test suite, each test once where it says the most, to stay well under CI's 20 minutes on 2
# cores (the summary gives each stage's time):
# - the gcc -Werror build: unit tests, lints, the units' verify, fuzz corpora replay, and the long fault
#   runs (suite "slow": shared pools under seeded faults, Sentinel failovers), whose timing wants the
#   optimised build, in the background beside the three stages that follow;
# - the units under a real systemd (the gcc build): the lane in the foreground, and the package built and
#   upgraded under load (systemd-upgrade: dpkg-buildpackage, then mostly waiting) in the background beside
#   the ASan/UBSan build and tests, as the long fault runs;
# - the clang AddressSanitizer/UndefinedBehaviorSanitizer build: unit tests, fuzz corpora, and every other
#   integration test against the real brokerd, which runs sanitized;
# - the unit tests under valgrind.
# `meson test -C build` alone still runs everything, integration tests included.
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
        [ -z "${slow_pid:-}" ] || kill "$slow_pid" 2>/dev/null || true
        [ -z "${upgrade_pid:-}" ] || kill "$upgrade_pid" 2>/dev/null || true
        [ -z "$current" ] || stages+=("$current: FAILED (exit $rc)")
        echo
        echo "==> summary (uid $(id -u), CapEff $(awk '/^CapEff/ { print $2 }' /proc/self/status))"
        local s
        for s in "${stages[@]}"; do echo "    $s"; done
}
trap summary EXIT

# stage NAME BUILD_DIR|LOG.json COMMAND…: runs a `meson test` stage and records its outcome, its time and
# what it skipped (LOG.json: a run beside another in the same build directory, its log named by --logbase).
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

stage "meson test (gcc, -Werror): unit, lint, the units' verify, fuzz" build \
        meson test -C build --print-errorlogs --suite unit --suite lint --suite units --suite fuzz

# The long fault runs mostly wait out node TTLs, failovers and recovery windows (about 35 s of CPU in
# seven minutes): they run in the background beside the ASan/UBSan build, the systemd stage and the
# ASan/UBSan tests, whose bounds, as theirs, are seconds (a busy CPU delays brokerd by milliseconds).
slow_log=$(mktemp)
meson test -C build --print-errorlogs --suite slow --logbase testlog-slow >"$slow_log" 2>&1 &
slow_pid=$!
slow_start=$SECONDS

# The package's upgrade under load in a booted Debian 12 root (issue 20): dpkg-buildpackage, then mostly
# waiting on restarts and jobs; in the background too, beside the ASan/UBSan build and tests.
upgrade_log=$(mktemp)
meson test -C build --print-errorlogs systemd-upgrade --logbase testlog-upgrade >"$upgrade_log" 2>&1 &
upgrade_pid=$!
upgrade_start=$SECONDS

echo "==> building with ASan/UBSan (clang), while the long fault runs run"
current="ASan/UBSan build"
if [ ! -f build-asan/build.ninja ]; then
        CC=clang meson setup build-asan -Dwerror=true -Dtests=enabled -Dredis=enabled -Db_sanitize=address,undefined -Db_lundef=false
fi
ninja -C build-asan
current=""

# Skipped without root, namespaces (CAP_SYS_ADMIN) or the Debian mirror.
stage "the units under a real systemd (a booted Debian 12 root)" build/meson-logs/testlog-systemd.json \
        meson test -C build --print-errorlogs systemd-lane --logbase testlog-systemd
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        stage "meson test under ASan/UBSan (clang): unit, fuzz, integration" build-asan \
        meson test -C build-asan --print-errorlogs --suite unit --suite fuzz --suite integration --no-suite slow

# wait_slow: the long fault runs' outcome, and their output, once they are done.
wait_slow() {
        local rc=0
        wait "$slow_pid" || rc=$?
        slow_pid=""
        cat "$slow_log"
        rm -f "$slow_log"
        echo "(started $((SECONDS - slow_start)) s ago, beside the stages above)"
        return $rc
}
stage "meson test (gcc): the long fault runs (shared pools under seeded faults, Sentinel failovers)" \
        build/meson-logs/testlog-slow.json \
        wait_slow

wait_upgrade() {
        local rc=0
        wait "$upgrade_pid" || rc=$?
        upgrade_pid=""
        cat "$upgrade_log"
        rm -f "$upgrade_log"
        echo "(started $((SECONDS - upgrade_start)) s ago, beside the stages above)"
        return $rc
}
stage "the package upgraded under load in a booted Debian 12 root (dpkg -i)" build/meson-logs/testlog-upgrade.json \
        wait_upgrade

# Ten times the timeouts: valgrind runs the scripts' Redis round trips and the simulator many times slower.
# no-valgrind: what valgrind cannot run (a clone() sharing memory) or runs too slowly for CI (the history
# writer's 200,000 rows, checked under ASan/UBSan instead; see tests/meson.build).
stage "unit tests under valgrind" build \
        meson test -C build --print-errorlogs --suite unit --no-suite no-valgrind --timeout-multiplier 10 \
        --wrap='valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite --fair-sched=yes -q'
