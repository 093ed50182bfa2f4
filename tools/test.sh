#!/bin/bash
# The whole test suite, each test once where it says the most, to stay well under CI's 20 minutes on 2
# cores (the summary gives each stage's time):
# - the gcc -Werror build: unit tests, lints, the units' verify, fuzz corpora replay, and the long fault
#   runs (suite "slow": shared pools under seeded faults, Sentinel failovers), whose timing wants the
#   optimised build, in the background from the end of the build, beside its unit tests and the stages that
#   follow;
# - the units under a real systemd (the gcc build): the lane in the foreground, and the package built and
#   upgraded under load (systemd-upgrade: dpkg-buildpackage, then mostly waiting) in the background beside
#   the ASan/UBSan build and tests, as the long fault runs;
# - the clang AddressSanitizer/UndefinedBehaviorSanitizer build: unit tests, fuzz corpora, and every other
#   integration test against the real brokerd, which runs sanitized, in two runs at once: the tests that
#   mostly wait on timers (suite "waits", tests/integration/meson.build and tests/meson.build), two at a time,
#   in the background from the end of the build, beside the systemd lane too;
# - the brokerd of an earlier version (tools/old-brokerd.sh), for the tests of a mixed fleet;
# - a build without hiredis (-Dredis=disabled): its unit tests, lints and fuzz corpora, in the background
#   beside the ASan/UBSan build;
# - the unit tests under valgrind, one at a time, in the background beside the ASan/UBSan tests (most of
#   whose time is waiting).
# Whatever runs in the background is waited for at the end, each in a stage of its own: the summary gives
# its outcome, what it skipped and when it ran, and the whole run's time.
# `meson test -C build` alone still runs everything, integration tests included.
#
# What cannot run where it runs (no root, no namespaces without CAP_SYS_ADMIN, a tool missing) is
# skipped, never failed: the summary at the end names each stage's outcome and every skipped test and
# case with its reason (tools/test-skips.py). tools/test-unprivileged.sh runs this as in a container.
set -euo pipefail
cd "$(dirname "$0")/.."

stages=()   # each stage's outcome, with what it skipped, for the summary
current=""
declare -A bg_pid bg_out bg_start bg_end   # the runs in the background, by key
summary() {
        local rc=$? key
        [ -z "$current" ] || stages+=("$current: FAILED (exit $rc)")
        local r
        for key in "${!bg_pid[@]}"; do
                if [ -s "${bg_end[$key]}" ]; then
                        r=0
                        wait "${bg_pid[$key]}" || r=$?
                        r="done (exit $r) by $(cat "${bg_end[$key]}") s, not reported (a stage before it failed)"
                        stages+=("the run in the background \"$key\": $r")
                else
                        kill "${bg_pid[$key]}" 2>/dev/null || true
                        stages+=("the run in the background \"$key\": STOPPED unfinished (from ${bg_start[$key]} s)")
                fi
        done
        echo
        echo "==> summary (uid $(id -u), CapEff $(awk '/^CapEff/ { print $2 }' /proc/self/status))"
        local s
        for s in "${stages[@]}"; do echo "    $s"; done
        echo "    in all: $SECONDS s"
}
trap summary EXIT

# stage NAME BUILD_DIR|LOG.json COMMAND…: runs a `meson test` stage (or waits for one run in the
# background: joined) and records its outcome, its time and what it skipped (LOG.json: a run beside another
# in the same build directory, its log named by --logbase).
stage() {
        local name=$1 dir=$2 skipped rc=0 start=$SECONDS
        shift 2
        echo "==> $name"
        current=$name
        span=""
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
        stages+=("$name: $outcome ${span:-in $((SECONDS - start)) s}${skipped:+$'\n'$skipped}")
}

# background KEY COMMAND…: starts a `meson test` run beside the stages that follow; `stage … joined KEY`
# waits for it and gives its outcome, its output and when it ran.
background() {
        local key=$1
        shift
        bg_out[$key]=$(mktemp)
        bg_end[$key]=$(mktemp)
        bg_start[$key]=$SECONDS
        (
                "$@" &
                child=$!
                trap 'kill "$child" 2>/dev/null; exit 143' TERM   # summary()'s, should a stage fail
                rc=0
                wait "$child" || rc=$?
                echo $SECONDS >"${bg_end[$key]}"
                exit $rc
        ) >"${bg_out[$key]}" 2>&1 &
        bg_pid[$key]=$!
}
joined() {
        local key=$1 rc=0 end
        wait "${bg_pid[$key]}" || rc=$?
        unset "bg_pid[$key]"
        cat "${bg_out[$key]}"
        end=$(cat "${bg_end[$key]}")
        end=${end:-$SECONDS}
        rm -f "${bg_out[$key]}" "${bg_end[$key]}"
        span="in $((end - bg_start[$key])) s (in the background, from ${bg_start[$key]} s to $end s)"
        echo "(ran $span)"
        return $rc
}

current="setup (tools/setup.sh)"
bash tools/setup.sh
stages+=("$current: done in $SECONDS s")
current=""

# The long fault runs mostly wait out node TTLs, failovers and recovery windows (about 35 s of CPU in
# seven minutes): they run in the background from the end of the gcc build, beside the gcc unit tests, the
# ASan/UBSan build, the systemd stage and the ASan/UBSan tests, whose bounds, as theirs, are seconds (a busy
# CPU delays brokerd by milliseconds). Started after the gcc unit tests and the old brokerd's build, they
# ended the run once the waits run took two tests at a time (811 s from 159 s to 970 s); they need neither.
# --no-rebuild: the runs beside one another in one build directory run no ninja of their own (tools/setup.sh
# built it; the gcc unit tests' run too).
background slow meson test -C build --no-rebuild --print-errorlogs --suite slow --logbase testlog-slow

stage "meson test (gcc, -Werror): unit, lint, the units' verify, fuzz" build/meson-logs/testlog.json \
        meson test -C build --no-rebuild --print-errorlogs --suite unit --suite lint --suite units --suite fuzz

# The brokerd of an earlier version, out of this clone's history (tools/old-brokerd.sh, ~12 s), for the tests
# of a fleet that mixes it with this build (test-shared-upgrade, and test-shared-liveness's node of the version
# before the live keys; both in suite "waits"): without it (a shallow clone) they skip, and the summary says so.
current="the brokerd of an earlier version (tools/old-brokerd.sh)"
start=$SECONDS
if old=$(tools/old-brokerd.sh build-old); then
        export SLOTBROKER_OLD_BROKERD=$old
        stages+=("$current: built in $((SECONDS - start)) s")
else
        stages+=("$current: NOT BUILT (its tests skip)")
fi
current=""

# The package's upgrade under load in a booted Debian 12 root (issue 20): dpkg-buildpackage, then mostly
# waiting on restarts and jobs; in the background too, beside the ASan/UBSan build and tests.
background upgrade meson test -C build --no-rebuild --print-errorlogs systemd-upgrade --logbase testlog-upgrade

# Without hiredis (-Dredis=disabled) everything but shared pools builds and works (meson.build): a build of its
# own, its unit tests and lints, in the background beside the ASan/UBSan build (both compile; the two share the
# cores they would take in turn). A HAVE_REDIS guard missed broke this build unseen once.
background noredis bash -c 'if [ ! -f build-noredis/build.ninja ]; then
                meson setup build-noredis -Dwerror=true -Dtests=enabled -Dredis=disabled >/dev/null
        fi &&
        { ninja -C build-noredis >build-noredis/ninja.log 2>&1 || { tail -n 60 build-noredis/ninja.log; false; }; } &&
        meson test -C build-noredis --no-rebuild --print-errorlogs --suite unit --suite lint --suite fuzz'

echo "==> building with ASan/UBSan (clang), while the long fault runs run"
current="ASan/UBSan build"
if [ ! -f build-asan/build.ninja ]; then
        CC=clang meson setup build-asan -Dwerror=true -Dtests=enabled -Dredis=enabled -Db_sanitize=address,undefined -Db_lundef=false
fi
ninja -C build-asan
current=""

# The ASan/UBSan tests in two runs at once. The tests of suite "waits" (they mostly wait on node TTLs, recovery
# windows, graces, cooldowns; their bounds are seconds) in the background from here, two at a time, the longest
# first (their priority): about 16 minutes of tests, 2 of them CPU, in about 8. They go beside the systemd stage
# as the long fault runs do (they were the run's tail, starting after it: ~110 s later), then beside the unit
# tests, the fuzz corpora and the other integration tests, which time answers more tightly and end the run:
# whatever mostly sleeps belongs in suite "waits" (one at a time, it was the run's tail: 698 s from 395 s to
# 1,093 s, 34 s past the foreground run). The variables reach only the sanitized binaries.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
background waits meson test -C build-asan --no-rebuild --print-errorlogs --suite waits --no-suite slow \
        --num-processes 2 --logbase testlog-waits

# Skipped without root, namespaces (CAP_SYS_ADMIN) or the Debian mirror.
stage "the units under a real systemd (a booted Debian 12 root)" build/meson-logs/testlog-systemd.json \
        meson test -C build --no-rebuild --print-errorlogs systemd-lane --logbase testlog-systemd

# The unit tests under valgrind, one at a time, in the background beside the ASan/UBSan tests (most of which
# wait on timers): what CPU those leave. Not beside the systemd lane, whose restarts under load are timed.
# Ten times the timeouts: valgrind runs the scripts' Redis round trips and the simulator many times slower.
# no-valgrind: what valgrind cannot run (a clone() sharing memory, pidfd_open()) or runs too slowly for CI (the history
# writer's 200,000 rows, checked under ASan/UBSan instead; see tests/meson.build).
background valgrind meson test -C build --no-rebuild --print-errorlogs --suite unit --no-suite no-valgrind \
        --num-processes 1 --timeout-multiplier 10 \
        --wrap='valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite --fair-sched=yes -q'

stage "the build without Redis (-Dredis=disabled): unit, lint, fuzz" build-noredis/meson-logs/testlog.json \
        joined noredis
stage "meson test under ASan/UBSan (clang): unit, fuzz, integration" build-asan/meson-logs/testlog.json \
        meson test -C build-asan --no-rebuild --print-errorlogs --suite unit --suite fuzz --suite integration \
        --no-suite slow --no-suite waits
stage "meson test under ASan/UBSan (clang): the integration tests that wait (suite waits)" \
        build-asan/meson-logs/testlog-waits.json joined waits
unset ASAN_OPTIONS UBSAN_OPTIONS

stage "meson test (gcc): the long fault runs (shared pools under seeded faults, Sentinel failovers)" \
        build/meson-logs/testlog-slow.json joined slow
stage "the package upgraded under load in a booted Debian 12 root (dpkg -i)" build/meson-logs/testlog-upgrade.json \
        joined upgrade
# (meson names the log of a run under --wrap after the wrapper: testlog-valgrind.json.)
stage "unit tests under valgrind" build/meson-logs/testlog-valgrind.json joined valgrind
